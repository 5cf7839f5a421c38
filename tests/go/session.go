package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

const (
	// How long one message is waited for.
	receiveTimeout = 10 * time.Second
	// How long "nothing more arrives" is waited for, after everything expected did arrive.
	quiet = 500 * time.Millisecond
)

// session is what the scenarios share: one client, the service's REST URL, and a run id that
// keeps their topic names apart from other runs' on the same server.
type session struct {
	client  pulsar.Client
	pulsar  string
	httpURL string
	run     string
	http    *http.Client
}

func newSession(pulsarURL, httpURL string) (*session, error) {
	client, err := newClient(pulsarURL)
	if err != nil {
		return nil, err
	}
	id := make([]byte, 4)
	if _, err := rand.Read(id); err != nil {
		return nil, err
	}
	return &session{
		client:  client,
		pulsar:  pulsarURL,
		httpURL: strings.TrimRight(httpURL, "/"),
		run:     hex.EncodeToString(id),
		http:    &http.Client{Timeout: 30 * time.Second},
	}, nil
}

func (s *session) topic(what string) string {
	return "persistent://public/default/go-" + what + "-" + s.run
}

// adminPath is Pulsar's admin path of a topic: /admin/v2/persistent/{t}/{n}/{topic}.
func adminPath(topic string) string {
	return "/admin/v2/persistent/" + strings.TrimPrefix(topic, "persistent://")
}

func (s *session) request(method, path, body string) (int, string, error) {
	var reader io.Reader
	if body != "" {
		reader = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, s.httpURL+path, reader)
	if err != nil {
		return 0, "", err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data), err
}

// compact asks for a compaction over REST (PUT .../compaction) and waits until it succeeded.
func (s *session) compact(topic string) error {
	path := adminPath(topic) + "/compaction"
	status, body, err := s.request(http.MethodPut, path, "")
	if err != nil {
		return err
	}
	if status != http.StatusNoContent {
		return fmt.Errorf("PUT %s: %d %s", path, status, body)
	}
	deadline := time.Now().Add(140 * time.Second)
	for {
		_, body, err := s.request(http.MethodGet, path, "")
		if err != nil {
			return err
		}
		var state struct {
			Status string `json:"status"`
		}
		if err := json.Unmarshal([]byte(body), &state); err != nil {
			return fmt.Errorf("GET %s: %v: %s", path, err, body)
		}
		if state.Status == "SUCCESS" {
			return nil
		}
		if state.Status == "ERROR" || time.Now().After(deadline) {
			return fmt.Errorf("compaction of %s: %s", topic, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *session) unbatched(topic string) (pulsar.Producer, error) {
	return s.client.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
}

// batched is a producer whose batches hold size messages, with no publish delay that could cut
// one short: a flush sends the rest.
func (s *session) batched(topic string, size uint) (pulsar.Producer, error) {
	return s.client.CreateProducer(pulsar.ProducerOptions{
		Topic:                   topic,
		BatchingMaxMessages:     size,
		BatchingMaxPublishDelay: time.Hour,
	})
}

func (s *session) subscribe(topic, subscription string, kind pulsar.SubscriptionType) (pulsar.Consumer, error) {
	return s.client.Subscribe(pulsar.ConsumerOptions{
		Topic:                       topic,
		SubscriptionName:            subscription,
		Type:                        kind,
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
	})
}

// sendAll sends messages through a batching producer asynchronously, flushes, and returns
// their ids in the order sent.
func sendAll(p pulsar.Producer, messages []*pulsar.ProducerMessage) ([]pulsar.MessageID, error) {
	ids := make([]pulsar.MessageID, len(messages))
	errs := make([]error, len(messages))
	done := make(chan struct{}, len(messages))
	for i, m := range messages {
		p.SendAsync(context.Background(), m, func(id pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
			ids[i], errs[i] = id, err
			done <- struct{}{}
		})
	}
	if err := p.Flush(); err != nil {
		return nil, err
	}
	for range messages {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			return nil, errors.New("a send was not acknowledged in 30 s")
		}
	}
	return ids, errors.Join(errs...)
}

func send(p pulsar.Producer, m *pulsar.ProducerMessage) (pulsar.MessageID, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return p.Send(ctx, m)
}

func receive(c pulsar.Consumer) (pulsar.Message, error) {
	ctx, cancel := context.WithTimeout(context.Background(), receiveTimeout)
	defer cancel()
	m, err := c.Receive(ctx)
	if err != nil {
		return nil, fmt.Errorf("no message in %s on %s: %w", receiveTimeout, c.Subscription(), err)
	}
	return m, nil
}

// nothingMore is what a consumer receives in the quiet interval: nil when nothing arrives.
func nothingMore(c pulsar.Consumer) map[string]any {
	ctx, cancel := context.WithTimeout(context.Background(), quiet)
	defer cancel()
	m, err := c.Receive(ctx)
	if err != nil {
		return nil
	}
	return describe(m)
}

// readAll reads every message from the reader's position to the end of the topic.
func readAll(r pulsar.Reader) ([]map[string]any, error) {
	got := []map[string]any{}
	for r.HasNext() {
		ctx, cancel := context.WithTimeout(context.Background(), receiveTimeout)
		m, err := r.Next(ctx)
		cancel()
		if err != nil {
			return got, fmt.Errorf("HasNext, but no message in %s: %w", receiveTimeout, err)
		}
		got = append(got, describe(m))
		if len(got) > 1000 {
			return got, errors.New("more than 1000 messages: the reader does not reach the end")
		}
	}
	return got, nil
}

// id writes a message id as "ledger:entry:batchIndex:partition".
func id(m pulsar.MessageID) string {
	if m == nil {
		return ""
	}
	return fmt.Sprintf("%d:%d:%d:%d", m.LedgerID(), m.EntryID(), m.BatchIdx(), m.PartitionIdx())
}

func ids(ms []pulsar.MessageID) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = id(m)
	}
	return out
}

func millis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// describe is what the tests compare of a message.
func describe(m pulsar.Message) map[string]any {
	properties := m.Properties()
	if properties == nil {
		properties = map[string]string{}
	}
	var key any
	if m.Key() != "" {
		key = m.Key()
	}
	return map[string]any{
		"id":              id(m.ID()),
		"batchSize":       m.ID().BatchSize(),
		"topic":           m.Topic(),
		"key":             key,
		"value":           base64.StdEncoding.EncodeToString(m.Payload()),
		"properties":      properties,
		"eventTime":       millis(m.EventTime()),
		"publishTime":     millis(m.PublishTime()),
		"redeliveryCount": m.RedeliveryCount(),
	}
}

func sentNode(key, value string, m pulsar.MessageID) map[string]any {
	var k any
	if key != "" {
		k = key
	}
	return map[string]any{"id": id(m), "key": k, "value": base64.StdEncoding.EncodeToString([]byte(value))}
}
