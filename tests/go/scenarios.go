package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// keyed is message i of a test: key k{i%3}, a property n=i, an event time.
func keyed(prefix string, i int, eventTime int64) *pulsar.ProducerMessage {
	return &pulsar.ProducerMessage{
		Key:        fmt.Sprintf("k%d", i%3),
		Payload:    []byte(fmt.Sprintf("%s%d", prefix, i)),
		Properties: map[string]string{"n": strconv.Itoa(i)},
		EventTime:  time.UnixMilli(eventTime + int64(i)),
	}
}

// produce: an unbatched and a batching producer (keys, properties, event times), and an
// Exclusive consumer of each topic that receives and acknowledges everything.
func produce(s *session, out *result) error {
	unbatched, batched := s.topic("unbatched"), s.topic("batched")
	out.set("unbatchedTopic", unbatched)
	out.set("batchedTopic", batched)
	p, err := s.unbatched(unbatched)
	if err != nil {
		return err
	}
	var sent []string
	for i := 0; i < 6; i++ {
		m, err := send(p, keyed("u", i, 1000))
		if err != nil {
			return err
		}
		sent = append(sent, id(m))
	}
	p.Close()
	out.set("unbatchedSent", sent)

	// Eight messages: a batch of five when the fifth is added, then three on the flush.
	bp, err := s.batched(batched, 5)
	if err != nil {
		return err
	}
	var messages []*pulsar.ProducerMessage
	for i := 0; i < 8; i++ {
		messages = append(messages, keyed("b", i, 2000))
	}
	bids, err := sendAll(bp, messages)
	bp.Close()
	if err != nil {
		return err
	}
	out.set("batchedSent", ids(bids))

	for _, t := range []struct {
		topic, field string
		count        int
	}{{unbatched, "unbatchedReceived", 6}, {batched, "batchedReceived", 8}} {
		c, err := s.subscribe(t.topic, "s", pulsar.Exclusive)
		if err != nil {
			return err
		}
		var got []map[string]any
		for i := 0; i < t.count; i++ {
			m, err := receive(c)
			if err != nil {
				c.Close()
				return err
			}
			got = append(got, describe(m))
			if err := c.Ack(m); err != nil {
				c.Close()
				return err
			}
		}
		out.set(t.field, got)
		out.set(t.field+"Extra", nothingMore(c))
		c.Close()
	}
	return nil
}

// shared: two consumers of one Shared subscription split a topic's messages (batched and not)
// between them, each message to one of them; a third consumer afterwards gets nothing.
func shared(s *session, out *result) error {
	topic := s.topic("shared")
	out.set("topic", topic)
	first, err := s.subscribe(topic, "workers", pulsar.Shared)
	if err != nil {
		return err
	}
	defer first.Close()
	second, err := s.subscribe(topic, "workers", pulsar.Shared)
	if err != nil {
		return err
	}
	defer second.Close()
	p, err := s.unbatched(topic)
	if err != nil {
		return err
	}
	var sent []string
	for i := 0; i < 10; i++ {
		m, err := send(p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("u%d", i))})
		if err != nil {
			p.Close()
			return err
		}
		sent = append(sent, id(m))
	}
	p.Close()
	bp, err := s.batched(topic, 5)
	if err != nil {
		return err
	}
	var messages []*pulsar.ProducerMessage
	for i := 0; i < 10; i++ {
		messages = append(messages, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("b%d", i))})
	}
	bids, err := sendAll(bp, messages)
	bp.Close()
	if err != nil {
		return err
	}
	sent = append(sent, ids(bids)...)
	out.set("sent", sent)

	// Both consumers receive at once, until every message arrived at one of them.
	got := map[string][]string{"first": {}, "second": {}}
	type delivery struct {
		who string
		m   pulsar.Message
	}
	arrivals := make(chan delivery)
	stop := make(chan struct{})
	defer close(stop)
	for who, c := range map[string]pulsar.Consumer{"first": first, "second": second} {
		go func(who string, c pulsar.Consumer) {
			for msg := range c.Chan() {
				select {
				case arrivals <- delivery{who, msg.Message}:
				case <-stop:
					return
				}
			}
		}(who, c)
	}
	deadline := time.After(receiveTimeout)
	for n := 0; n < len(sent); n++ {
		select {
		case d := <-arrivals:
			got[d.who] = append(got[d.who], string(d.m.Payload()))
			c := first
			if d.who == "second" {
				c = second
			}
			if err := c.Ack(d.m); err != nil {
				return err
			}
		case <-deadline:
			out.set("received", got)
			return fmt.Errorf("%d of %d messages arrived in %s", n, len(sent), receiveTimeout)
		}
	}
	// Anything more in the quiet interval would be a message delivered twice.
	select {
	case d := <-arrivals:
		got[d.who+"Extra"] = []string{string(d.m.Payload())}
	case <-time.After(quiet):
	}
	out.set("received", got)
	return nil
}

// redelivery: what a consumer did not acknowledge is delivered again to the next consumer of
// the subscription, on a new connection (a new client); a negative acknowledgement is
// redelivered to the same consumer; batch-index acknowledgements leave only the members not
// acknowledged.
func redelivery(s *session, out *result) error {
	topic := s.topic("acks")
	out.set("topic", topic)
	p, err := s.unbatched(topic)
	if err != nil {
		return err
	}
	var sent []string
	for i := 0; i < 8; i++ {
		m, err := send(p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("a%d", i))})
		if err != nil {
			p.Close()
			return err
		}
		sent = append(sent, id(m))
	}
	p.Close()
	out.set("sent", sent)

	// The first consumer acknowledges all but the 4th and the 8th, and its client goes away.
	other, err := newClient(s.pulsar)
	if err != nil {
		return err
	}
	c, err := other.Subscribe(pulsar.ConsumerOptions{
		Topic:                       topic,
		SubscriptionName:            "s",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
	})
	if err != nil {
		other.Close()
		return err
	}
	var first []string
	for i := 0; i < 8; i++ {
		m, err := receive(c)
		if err != nil {
			other.Close()
			return err
		}
		first = append(first, id(m.ID()))
		if i != 3 && i != 7 {
			if err := c.Ack(m); err != nil {
				other.Close()
				return err
			}
		}
	}
	out.set("firstReceived", first)
	c.Close()
	other.Close()

	// The next consumer, on this client's connection, gets those two; it negatively
	// acknowledges the first once and gets it again, with its redelivery count. Its acks go at
	// once: on an Exclusive subscription a nack redelivers every unacknowledged message (as
	// Pulsar's broker does), and an ack of the second held back by the client's 100 ms grouping
	// could reach the broker after the redelivery it asked for ~30 ms after the nack.
	c, err = s.client.Subscribe(pulsar.ConsumerOptions{
		Topic:                       topic,
		SubscriptionName:            "s",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
		NackRedeliveryDelay:         100 * time.Millisecond,
		AckGroupingOptions:          &pulsar.AckGroupingOptions{MaxSize: 1},
	})
	if err != nil {
		return err
	}
	defer c.Close()
	var again []map[string]any
	nacked := false
	for len(again) < 3 {
		m, err := receive(c)
		if err != nil {
			out.set("redelivered", again)
			return err
		}
		again = append(again, describe(m))
		if !nacked {
			c.Nack(m)
			nacked = true
		} else if err := c.Ack(m); err != nil {
			return err
		}
	}
	out.set("redelivered", again)
	out.set("extra", nothingMore(c))

	// Batches of five, batch-index acknowledgements of the first seven, a new consumer.
	batched := s.topic("batch-acks")
	out.set("batchedTopic", batched)
	bp, err := s.batched(batched, 5)
	if err != nil {
		return err
	}
	var messages []*pulsar.ProducerMessage
	for i := 0; i < 10; i++ {
		messages = append(messages, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("b%d", i))})
	}
	bids, err := sendAll(bp, messages)
	bp.Close()
	if err != nil {
		return err
	}
	out.set("batchedSent", ids(bids))
	options := pulsar.ConsumerOptions{
		Topic:                          batched,
		SubscriptionName:               "s",
		SubscriptionInitialPosition:    pulsar.SubscriptionPositionEarliest,
		EnableBatchIndexAcknowledgment: true,
	}
	bc, err := s.client.Subscribe(options)
	if err != nil {
		return err
	}
	for i := 0; i < 10; i++ {
		m, err := receive(bc)
		if err != nil {
			bc.Close()
			return err
		}
		if i < 7 {
			if err := bc.Ack(m); err != nil {
				bc.Close()
				return err
			}
		}
	}
	bc.Close()
	bc, err = s.client.Subscribe(options)
	if err != nil {
		return err
	}
	defer bc.Close()
	var rest []map[string]any
	for i := 0; i < 3; i++ {
		m, err := receive(bc)
		if err != nil {
			out.set("batchRedelivered", rest)
			return err
		}
		rest = append(rest, describe(m))
		if err := bc.Ack(m); err != nil {
			return err
		}
	}
	out.set("batchRedelivered", rest)
	out.set("batchExtra", nothingMore(bc))
	return cumulative(s, out)
}

// cumulative: a consumer acknowledges the first three of five messages with one cumulative
// acknowledgement and leaves; the next consumer gets the last two.
func cumulative(s *session, out *result) error {
	topic := s.topic("cumulative")
	out.set("cumulativeTopic", topic)
	p, err := s.unbatched(topic)
	if err != nil {
		return err
	}
	var sent []string
	for i := 0; i < 5; i++ {
		m, err := send(p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("c%d", i))})
		if err != nil {
			p.Close()
			return err
		}
		sent = append(sent, id(m))
	}
	p.Close()
	out.set("cumulativeSent", sent)
	c, err := s.subscribe(topic, "s", pulsar.Exclusive)
	if err != nil {
		return err
	}
	var third pulsar.Message
	for i := 0; i < 3; i++ {
		if third, err = receive(c); err != nil {
			c.Close()
			return err
		}
	}
	if err := c.AckCumulative(third); err != nil {
		c.Close()
		return err
	}
	c.Close()
	c, err = s.subscribe(topic, "s", pulsar.Exclusive)
	if err != nil {
		return err
	}
	defer c.Close()
	out.set("afterCumulative", drain(c))
	return nil
}
