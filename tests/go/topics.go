package main

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/apache/pulsar-client-go/pulsar"
)

// partitions: a topic of three partitions (created over REST); the client lists them, a
// producer routes by key (and a custom router sends "pinned" messages to partition 2), a
// consumer of the topic receives each message with its partition's topic and index, and the
// last message ids name every partition.
func partitions(s *session, out *result) error {
	topic := s.topic("partitioned")
	out.set("topic", topic)
	path := adminPath(topic) + "/partitions"
	if status, body, err := s.request(http.MethodPut, path, "3"); err != nil || status != http.StatusNoContent {
		return fmt.Errorf("PUT %s: %d %s %v", path, status, body, err)
	}
	names, err := s.client.TopicPartitions(topic)
	if err != nil {
		return err
	}
	out.set("partitions", names)
	p, err := s.client.CreateProducer(pulsar.ProducerOptions{
		Topic:           topic,
		DisableBatching: true,
		MessageRouter: func(m *pulsar.ProducerMessage, md pulsar.TopicMetadata) int {
			if strings.HasPrefix(string(m.Payload), "pinned") {
				return 2 % int(md.NumPartitions())
			}
			return int(hashKey(m.Key) % md.NumPartitions())
		},
	})
	if err != nil {
		return err
	}
	sent := map[string]string{}
	for i := 0; i < 6; i++ {
		value := fmt.Sprintf("v%d", i)
		if i >= 4 {
			value = fmt.Sprintf("pinned%d", i)
		}
		m, err := send(p, &pulsar.ProducerMessage{Key: fmt.Sprintf("key%d", i), Payload: []byte(value)})
		if err != nil {
			p.Close()
			return err
		}
		sent[value] = id(m)
	}
	p.Close()
	out.set("sent", sent)
	c, err := s.subscribe(topic, "s", pulsar.Exclusive)
	if err != nil {
		return err
	}
	defer c.Close()
	received := map[string]map[string]any{}
	for i := 0; i < len(sent); i++ {
		m, err := receive(c)
		if err != nil {
			out.set("received", received)
			return err
		}
		received[string(m.Payload())] = describe(m)
		if err := c.Ack(m); err != nil {
			return err
		}
	}
	out.set("received", received)
	out.set("extra", nothingMore(c))
	last, err := c.GetLastMessageIDs()
	if err != nil {
		return fmt.Errorf("last message ids: %w", err)
	}
	lastIDs := map[string]string{}
	for _, m := range last {
		lastIDs[m.Topic()] = id(m)
	}
	out.set("last", lastIDs)
	return nil
}

// hashKey is a small stable hash of a key (the router's choice must be predictable here).
func hashKey(key string) uint32 {
	var h uint32
	for _, b := range []byte(key) {
		h = h*31 + uint32(b)
	}
	return h
}

// httpURL: a client given the service's HTTP URL instead of the binary protocol's finds the
// topic through Pulsar's lookup REST paths, then produces and consumes over the binary protocol.
func httpURL(s *session, out *result) error {
	client, err := newClient(s.httpURL)
	if err != nil {
		return err
	}
	defer client.Close()
	topic := s.topic("http")
	out.set("topic", topic)
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	if err != nil {
		return err
	}
	m, err := send(p, &pulsar.ProducerMessage{Key: "k", Payload: []byte("over http")})
	p.Close()
	if err != nil {
		return err
	}
	out.set("sent", id(m))
	c, err := client.Subscribe(pulsar.ConsumerOptions{
		Topic:                       topic,
		SubscriptionName:            "s",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
	})
	if err != nil {
		return err
	}
	defer c.Close()
	out.set("received", drain(c))
	return nil
}
