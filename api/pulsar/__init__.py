"""Pulsar's binary protocol (``pulsar://host:6650``): an edge beside REST, over the same service.

``framing`` cuts bytes into commands and back (pure); ``connection`` is the state machine of one
client connection; ``lookup``, ``produce``, ``consume`` and ``schemas`` serve one family of
commands each (``consume``'s consumers in ``delivery``, ``consumers`` and ``readers``), and
``commands`` gathers their handlers into the table every connection dispatches through;
``listener`` starts and stops the TCP server with the app.
"""
