package main

import (
	"fmt"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// keyShared: two consumers of a Key_Shared subscription, and a producer that batches by key
// (Go's KeyBasedBatchBuilder, what Pulsar advises for Key_Shared): each consumer's messages,
// in the order received.
func keyShared(s *session, out *result) error {
	topic := s.topic("key-shared")
	out.set("topic", topic)
	consumers := map[string]pulsar.Consumer{}
	for _, who := range []string{"first", "second"} {
		c, err := s.subscribe(topic, "by-key", pulsar.KeyShared)
		if err != nil {
			return err
		}
		defer c.Close()
		consumers[who] = c
	}
	p, err := s.client.CreateProducer(pulsar.ProducerOptions{
		Topic:                   topic,
		BatcherBuilderType:      pulsar.KeyBasedBatchBuilder,
		BatchingMaxMessages:     10,
		BatchingMaxPublishDelay: time.Hour,
	})
	if err != nil {
		return err
	}
	var messages []*pulsar.ProducerMessage
	for i := 0; i < 20; i++ {
		messages = append(messages, &pulsar.ProducerMessage{Key: fmt.Sprintf("k%d", i%4), Payload: []byte(fmt.Sprint(i))})
	}
	_, err = sendAll(p, messages)
	p.Close()
	if err != nil {
		return err
	}
	received := map[string][]map[string]any{}
	for who, c := range consumers {
		received[who] = drain(c)
	}
	out.set("received", received)
	return nil
}

// failover: two consumers of a Failover subscription; one of them, the active one, receives
// everything; when it leaves, the other receives what comes next.
func failover(s *session, out *result) error {
	topic := s.topic("failover")
	out.set("topic", topic)
	consumers := map[string]pulsar.Consumer{}
	for _, who := range []string{"first", "second"} {
		c, err := s.subscribe(topic, "standby", pulsar.Failover)
		if err != nil {
			return err
		}
		defer c.Close()
		consumers[who] = c
	}
	p, err := s.unbatched(topic)
	if err != nil {
		return err
	}
	defer p.Close()
	for i := 0; i < 3; i++ {
		if _, err := send(p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("before%d", i))}); err != nil {
			return err
		}
	}
	before := map[string][]map[string]any{}
	active := ""
	for who, c := range consumers {
		before[who] = drain(c)
		if len(before[who]) > 0 {
			active = who
		}
	}
	out.set("before", before)
	if active == "" {
		return fmt.Errorf("neither consumer received anything")
	}
	consumers[active].Close()
	for i := 0; i < 3; i++ {
		if _, err := send(p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("after%d", i))}); err != nil {
			return err
		}
	}
	after := map[string][]map[string]any{}
	for who, c := range consumers {
		if who != active {
			after[who] = drain(c)
		}
	}
	out.set("active", active)
	out.set("after", after)
	return nil
}
