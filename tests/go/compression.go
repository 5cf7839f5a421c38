package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

// compression: batches compressed with each of Go's codecs (its own implementations of LZ4,
// ZLIB and ZSTD) and a compressed unbatched message, on one topic with overlapping keys; a
// compaction, then readers of the compacted view and of the full log.
func compression(s *session, out *result) error {
	topic := s.topic("compression")
	out.set("topic", topic)
	var sent []map[string]any
	for _, c := range []struct {
		name  string
		codec pulsar.CompressionType
		keys  []string
	}{
		{"lz4", pulsar.LZ4, []string{"k0", "k1", "k2", "k3"}},
		{"zlib", pulsar.ZLib, []string{"k1", "k2"}},
		{"zstd", pulsar.ZSTD, []string{"k3"}},
	} {
		p, err := s.client.CreateProducer(pulsar.ProducerOptions{
			Topic:                   topic,
			CompressionType:         c.codec,
			BatchingMaxMessages:     uint(len(c.keys)),
			BatchingMaxPublishDelay: time.Hour,
		})
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		var messages []*pulsar.ProducerMessage
		for _, k := range c.keys {
			messages = append(messages, &pulsar.ProducerMessage{Key: k, Payload: []byte(compressible(c.name, k))})
		}
		got, err := sendAll(p, messages)
		p.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		for i, k := range c.keys {
			sent = append(sent, sentNode(k, compressible(c.name, k), got[i]))
		}
	}
	single, err := s.client.CreateProducer(pulsar.ProducerOptions{
		Topic:           topic,
		CompressionType: pulsar.LZ4,
		DisableBatching: true,
	})
	if err != nil {
		return err
	}
	m, err := send(single, &pulsar.ProducerMessage{Key: "k4", Payload: []byte(compressible("single", "k4"))})
	single.Close()
	if err != nil {
		return err
	}
	sent = append(sent, sentNode("k4", compressible("single", "k4"), m))
	out.set("sent", sent)
	if err := s.compact(topic); err != nil {
		return err
	}
	compacted, err := s.read(topic, pulsar.EarliestMessageID(), false, true)
	out.set("compactedReader", compacted)
	if err != nil {
		return err
	}
	full, err := s.read(topic, pulsar.EarliestMessageID(), false, false)
	out.set("fullReader", full)
	return err
}

// compressible is a value that the codecs do shrink.
func compressible(codec, key string) string {
	return codec + "-" + key + "-" + strings.Repeat("abcd", 64)
}
