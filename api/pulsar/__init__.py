"""Pulsar's binary protocol (``pulsar://host:6650``): an edge beside REST, over the same service.

``framing`` cuts bytes into commands and back (pure); ``connection`` is the state machine of one
client connection; ``lookup``, ``produce`` and ``consume`` serve one family of commands each;
``listener`` starts and stops the TCP server with the app.
"""
