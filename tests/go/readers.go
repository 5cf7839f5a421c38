package main

import (
	"context"
	"fmt"
	"net/http"
	"reflect"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// fill writes six unbatched messages and a batch of four to a new topic, a few milliseconds
// apart (so that their publish times differ), and returns their ids.
func fill(s *session, topic string) ([]pulsar.MessageID, error) {
	p, err := s.unbatched(topic)
	if err != nil {
		return nil, err
	}
	var sent []pulsar.MessageID
	for i := 0; i < 6; i++ {
		m, err := send(p, &pulsar.ProducerMessage{Key: fmt.Sprintf("k%d", i), Payload: []byte(fmt.Sprintf("m%d", i))})
		if err != nil {
			p.Close()
			return nil, err
		}
		sent = append(sent, m)
		time.Sleep(20 * time.Millisecond)
	}
	p.Close()
	bp, err := s.batched(topic, 4)
	if err != nil {
		return nil, err
	}
	var batch []*pulsar.ProducerMessage
	for i := 6; i < 10; i++ {
		batch = append(batch, &pulsar.ProducerMessage{Key: fmt.Sprintf("k%d", i), Payload: []byte(fmt.Sprintf("m%d", i))})
	}
	bids, err := sendAll(bp, batch)
	bp.Close()
	if err != nil {
		return nil, err
	}
	return append(sent, bids...), nil
}

func (s *session) read(topic string, start pulsar.MessageID, inclusive, compacted bool) ([]map[string]any, error) {
	r, err := s.client.CreateReader(pulsar.ReaderOptions{
		Topic:                   topic,
		StartMessageID:          start,
		StartMessageIDInclusive: inclusive,
		ReadCompacted:           compacted,
	})
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return readAll(r)
}

// reader: Readers from the earliest message, from a message id (exclusive, the default, and
// inclusive), from a batch member's id, and from the latest (nothing to read).
func reader(s *session, out *result) error {
	topic := s.topic("reader")
	out.set("topic", topic)
	sent, err := fill(s, topic)
	if err != nil {
		return err
	}
	out.set("sent", ids(sent))
	for _, r := range []struct {
		field     string
		start     pulsar.MessageID
		inclusive bool
	}{
		{"earliest", pulsar.EarliestMessageID(), false},
		{"afterThird", sent[2], false},
		{"fromThird", sent[2], true},
		{"afterBatchMember", sent[7], false},
		{"fromBatchMember", sent[7], true},
		{"latest", pulsar.LatestMessageID(), false},
	} {
		got, err := s.read(topic, r.start, r.inclusive, false)
		out.set(r.field, got)
		if err != nil {
			return fmt.Errorf("%s: %w", r.field, err)
		}
	}
	return nil
}

// seek: a consumer reads everything and acknowledges it, then seeks back by message id and by
// publish time, and receives from there again; a reader does the same.
func seek(s *session, out *result) error {
	topic := s.topic("seek")
	out.set("topic", topic)
	sent, err := fill(s, topic)
	if err != nil {
		return err
	}
	out.set("sent", ids(sent))
	c, err := s.subscribe(topic, "s", pulsar.Exclusive)
	if err != nil {
		return err
	}
	defer c.Close()
	var all []map[string]any
	for range sent {
		m, err := receive(c)
		if err != nil {
			return err
		}
		all = append(all, describe(m))
		if err := c.Ack(m); err != nil {
			return err
		}
	}
	out.set("received", all)
	// Seek by id. The service delivers from the message named, as Pulsar's broker does; Go's
	// consumer drops the messages up to and including its seek id (it treats it as an
	// exclusive start), so the first it hands over is the one after.
	if err := c.Seek(sent[2]); err != nil {
		return fmt.Errorf("seek by id: %w", err)
	}
	out.set("afterSeekById", drain(c))
	// Seek by time: from the first message published at or after it.
	at := time.UnixMilli(all[4]["publishTime"].(int64))
	out.set("seekTime", at.UnixMilli())
	if err := c.SeekByTime(at); err != nil {
		return fmt.Errorf("seek by time: %w", err)
	}
	out.set("afterSeekByTime", drain(c))

	r, err := s.client.CreateReader(pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.EarliestMessageID()})
	if err != nil {
		return err
	}
	defer r.Close()
	if _, err := readAll(r); err != nil {
		return err
	}
	if err := r.Seek(sent[3]); err != nil {
		return fmt.Errorf("reader seek by id: %w", err)
	}
	got, err := readAll(r)
	out.set("readerAfterSeekById", got)
	if err != nil {
		return err
	}
	if err := r.SeekByTime(at); err != nil {
		return fmt.Errorf("reader seek by time: %w", err)
	}
	got, err = readAll(r)
	out.set("readerAfterSeekByTime", got)
	return err
}

// drain receives and acknowledges messages until none arrives in the quiet interval (a little
// longer for the first: a seek reconnects the consumer).
func drain(c pulsar.Consumer) []map[string]any {
	got := []map[string]any{}
	wait := 5 * quiet
	for {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		m, err := c.Receive(ctx)
		cancel()
		if err != nil {
			return got
		}
		got = append(got, describe(m))
		_ = c.Ack(m)
		wait = quiet
	}
}

// receiveN receives n messages and acknowledges them.
func receiveN(c pulsar.Consumer, n int) ([]map[string]any, error) {
	got := []map[string]any{}
	for i := 0; i < n; i++ {
		m, err := receive(c)
		if err != nil {
			return got, err
		}
		got = append(got, describe(m))
		if err := c.Ack(m); err != nil {
			return got, err
		}
	}
	return got, nil
}

// lastID: the last message id of an empty topic, after unbatched sends and after a batch, as a
// consumer (GetLastMessageIDs) and a reader (GetLastMessageID) ask for it.
func lastID(s *session, out *result) error {
	topic := s.topic("lastid")
	out.set("topic", topic)
	c, err := s.subscribe(topic, "s", pulsar.Exclusive)
	if err != nil {
		return err
	}
	defer c.Close()
	last := func(field string) error {
		got, err := c.GetLastMessageIDs()
		if err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
		var named []map[string]any
		for _, m := range got {
			named = append(named, map[string]any{"id": id(m), "topic": m.Topic()})
		}
		out.set(field, named)
		return nil
	}
	if err := last("empty"); err != nil {
		return err
	}
	p, err := s.unbatched(topic)
	if err != nil {
		return err
	}
	var sent []pulsar.MessageID
	for i := 0; i < 3; i++ {
		m, err := send(p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("m%d", i))})
		if err != nil {
			p.Close()
			return err
		}
		sent = append(sent, m)
	}
	p.Close()
	if err := last("afterUnbatched"); err != nil {
		return err
	}
	bp, err := s.batched(topic, 3)
	if err != nil {
		return err
	}
	bids, err := sendAll(bp, []*pulsar.ProducerMessage{{Payload: []byte("b0")}, {Payload: []byte("b1")}, {Payload: []byte("b2")}})
	bp.Close()
	if err != nil {
		return err
	}
	out.set("sent", ids(append(sent, bids...)))
	if err := last("afterBatch"); err != nil {
		return err
	}
	r, err := s.client.CreateReader(pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.EarliestMessageID()})
	if err != nil {
		return err
	}
	defer r.Close()
	m, err := r.GetLastMessageID()
	if err != nil {
		return fmt.Errorf("reader: %w", err)
	}
	out.set("reader", id(m))
	return nil
}

// compacted: keyed messages (batched and not, a tombstone, a keyless one), a compaction over
// REST, one message after it, then readers with and without readCompacted, a readCompacted
// consumer of a durable subscription, and a TableView.
func compacted(s *session, out *result) error {
	topic := s.topic("compacted")
	out.set("topic", topic)
	single, err := s.unbatched(topic)
	if err != nil {
		return err
	}
	defer single.Close()
	batches, err := s.batched(topic, 3)
	if err != nil {
		return err
	}
	defer batches.Close()
	var sent []map[string]any
	put := func(p pulsar.Producer, key, value string) error {
		message := &pulsar.ProducerMessage{Key: key, Payload: []byte(value)}
		if value == "" {
			// Go's client 0.19 drops an unbatched message with neither payload nor properties
			// as corrupt, from Pulsar's broker too (apache/pulsar-client-go#1482): the
			// tombstone carries a property so that the full reader shows it.
			message.Properties = map[string]string{"deleted": "true"}
		}
		m, err := send(p, message)
		if err == nil {
			sent = append(sent, sentNode(key, value, m))
		}
		return err
	}
	for _, kv := range [][2]string{{"k0", "a0"}, {"k1", "a1"}, {"k2", "a2"}, {"k3", "a3"}} {
		if err := put(single, kv[0], kv[1]); err != nil {
			return err
		}
	}
	batch := [][2]string{{"k0", "b0"}, {"k1", "b1"}, {"k4", "b4"}}
	var messages []*pulsar.ProducerMessage
	for _, kv := range batch {
		messages = append(messages, &pulsar.ProducerMessage{Key: kv[0], Payload: []byte(kv[1])})
	}
	bids, err := sendAll(batches, messages)
	if err != nil {
		return err
	}
	for i, kv := range batch {
		sent = append(sent, sentNode(kv[0], kv[1], bids[i]))
	}
	// An empty value deletes its key; a message without a key is not kept.
	if err := put(single, "k2", ""); err != nil {
		return err
	}
	if err := put(single, "", "nokey"); err != nil {
		return err
	}
	out.set("sent", sent)
	if err := s.compact(topic); err != nil {
		return err
	}
	if err := put(single, "k1", "after"); err != nil {
		return err
	}
	out.set("sent", sent)

	got, err := s.read(topic, pulsar.EarliestMessageID(), false, true)
	out.set("compactedReader", got)
	if err != nil {
		return err
	}
	full, err := s.read(topic, pulsar.EarliestMessageID(), false, false)
	out.set("fullReader", full)
	if err != nil {
		return err
	}
	c, err := s.client.Subscribe(pulsar.ConsumerOptions{
		Topic:                       topic,
		SubscriptionName:            "compacted-sub",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
		ReadCompacted:               true,
	})
	if err != nil {
		return err
	}
	defer c.Close()
	consumed, err := receiveN(c, len(got))
	out.set("compactedConsumer", consumed)
	if err != nil {
		return err
	}
	out.set("compactedConsumerExtra", nothingMore(c))

	// A TableView: the latest value of each key, built on a readCompacted reader. Its STRING
	// schema on a topic whose messages have none is refused under Pulsar's default strategy
	// (FULL), as Pulsar's broker refuses it ("Failed to add schema to an active topic with
	// empty(BYTES) schema"): the topic's strategy lets it read them as strings.
	path := adminPath(topic) + "/schemaCompatibilityStrategy"
	if status, body, err := s.request(http.MethodPut, path, `"ALWAYS_COMPATIBLE"`); err != nil || status/100 != 2 {
		return fmt.Errorf("PUT %s: %d %s %v", path, status, body, err)
	}
	tv, err := s.client.CreateTableView(pulsar.TableViewOptions{
		Topic:           topic,
		Schema:          pulsar.NewStringSchema(nil),
		SchemaValueType: reflect.TypeOf(new(string)),
	})
	if err != nil {
		return fmt.Errorf("table view: %w", err)
	}
	defer tv.Close()
	table := map[string]string{}
	for k, v := range tv.Entries() {
		table[k] = *(v.(*string))
	}
	out.set("tableView", table)
	return nil
}
