package main

// Scenarios of which consumer gets what (issue 51): Failover's active consumer as the client's
// EventListener hears it, consumers reconnected by seeks, and negative acknowledgements
// redelivered after the client's delay. The Go client v0.19.0 has no priority level option (it
// sends none), so priority levels are the Java client's scenario.

import (
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// events records what a consumer's EventListener hears: every event ("partition:active" or
// "partition:inactive", in order) and the last one of each partition.
type events struct {
	mu   sync.Mutex
	seen []string
	by   map[string]string
}

func (e *events) BecameActive(_ pulsar.Consumer, _ string, partition int32) {
	e.add(partition, "active")
}

func (e *events) BecameInactive(_ pulsar.Consumer, _ string, partition int32) {
	e.add(partition, "inactive")
}

func (e *events) add(partition int32, what string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seen = append(e.seen, fmt.Sprintf("%d:%s", partition, what))
	if e.by == nil {
		e.by = map[string]string{}
	}
	e.by[fmt.Sprint(partition)] = what
}

func (e *events) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string{}, e.seen...)
}

// last is each partition's last event: partition -> "active" or "inactive".
func (e *events) last() map[string]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]string{}
	for k, v := range e.by {
		out[k] = v
	}
	return out
}

func (s *session) failoverWithListener(topic, name string, listener *events) (pulsar.Consumer, error) {
	return s.client.Subscribe(pulsar.ConsumerOptions{
		Topic:                       topic,
		SubscriptionName:            "listened",
		Type:                        pulsar.Failover,
		Name:                        name,
		EventListener:               listener,
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
	})
}

// activeListener: two Failover consumers ("a", "b") of a topic of two partitions, each with an
// EventListener; what each hears per partition; then "a" closes and "b" hears it became active
// on the partition "a" had.
func activeListener(s *session, out *result) error {
	topic := s.topic("active-listener")
	out.set("topic", topic)
	status, body, err := s.request(http.MethodPut, adminPath(topic)+"/partitions", "2")
	if err != nil {
		return err
	}
	if status != http.StatusNoContent {
		return fmt.Errorf("creating %s: %d %s", topic, status, body)
	}
	heard := map[string]*events{"a": {}, "b": {}}
	consumers := map[string]pulsar.Consumer{}
	for _, who := range []string{"a", "b"} {
		c, err := s.failoverWithListener(topic, who, heard[who])
		if err != nil {
			return err
		}
		consumers[who] = c
	}
	defer consumers["b"].Close()
	time.Sleep(time.Second)
	out.set("before", map[string]any{"a": heard["a"].last(), "b": heard["b"].last()})
	consumers["a"].Close()
	time.Sleep(time.Second)
	out.set("after", heard["b"].last())
	out.set("events", map[string]any{"a": heard["a"].list(), "b": heard["b"].list()})
	return nil
}

// reseek: an Exclusive consumer seeks back to the first message three times (each seek
// closes it from the broker's side and the client subscribes again with the same consumer id
// on its connection): the first message each time, and no error.
func reseek(s *session, out *result) error {
	topic := s.topic("reseek")
	out.set("topic", topic)
	p, err := s.unbatched(topic)
	if err != nil {
		return err
	}
	defer p.Close()
	for i := 0; i < 3; i++ {
		if _, err := send(p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("m%d", i))}); err != nil {
			return err
		}
	}
	c, err := s.subscribe(topic, "reseek", pulsar.Exclusive)
	if err != nil {
		return err
	}
	defer c.Close()
	firsts := []string{}
	var first pulsar.MessageID
	for round := 0; round < 3; round++ {
		m, err := receive(c)
		if err != nil {
			return err
		}
		if first == nil {
			first = m.ID()
		}
		firsts = append(firsts, string(m.Payload()))
		out.set("firsts", firsts)
		// By the first message's id: the client refuses EarliestMessageID (partition -1) here.
		if err := c.Seek(first); err != nil {
			return fmt.Errorf("seek %d: %w", round, err)
		}
	}
	m, err := receive(c)
	if err != nil {
		return err
	}
	firsts = append(firsts, string(m.Payload()))
	out.set("firsts", firsts)
	return nil
}

// nackDelay: a Shared consumer with a 100 ms NackRedeliveryDelay negatively acknowledges each
// of five messages once; the milliseconds from each Nack to its redelivery, sorted.
func nackDelay(s *session, out *result) error {
	topic := s.topic("nack-delay")
	out.set("topic", topic)
	c, err := s.client.Subscribe(pulsar.ConsumerOptions{
		Topic:               topic,
		SubscriptionName:    "nacked",
		Type:                pulsar.Shared,
		NackRedeliveryDelay: 100 * time.Millisecond,
	})
	if err != nil {
		return err
	}
	defer c.Close()
	p, err := s.unbatched(topic)
	if err != nil {
		return err
	}
	defer p.Close()
	delays := []int64{}
	for i := 0; i < 5; i++ {
		if _, err := send(p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("m%d", i))}); err != nil {
			return err
		}
		m, err := receive(c)
		if err != nil {
			return err
		}
		nacked := time.Now()
		c.Nack(m)
		again, err := receive(c)
		if err != nil {
			return err
		}
		if string(again.Payload()) != string(m.Payload()) || again.RedeliveryCount() != 1 {
			return fmt.Errorf("after a nack of %q: %q, redelivery count %d", m.Payload(), again.Payload(), again.RedeliveryCount())
		}
		delays = append(delays, time.Since(nacked).Milliseconds())
		if err := c.Ack(again); err != nil {
			return err
		}
	}
	sort.Slice(delays, func(i, j int) bool { return delays[i] < delays[j] })
	out.set("delaysMs", delays)
	return nil
}
