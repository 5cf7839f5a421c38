package main

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/crypto"
	"github.com/apache/pulsar-client-go/pulsaradmin/pkg/utils"
)

// The encryption key's name, as the producer names it in each message's encryption_keys.
const keyName = "go-rsa"

// keyPair writes a fresh RSA key pair as PEM files (PKCS#1 private, PKIX public: what Go's
// FileKeyReader parses) and returns a key reader over them.
func keyPair() (crypto.KeyReader, func(), error) {
	dir, err := os.MkdirTemp("", "go-keys-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	public, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	pub, priv := filepath.Join(dir, "public.pem"), filepath.Join(dir, "private.pem")
	if err := os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: public}), 0o600); err != nil {
		cleanup()
		return nil, nil, err
	}
	private := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(priv, private, 0o600); err != nil {
		cleanup()
		return nil, nil, err
	}
	return crypto.NewFileKeyReader(pub, priv), cleanup, nil
}

// encryption: an encrypting producer (a batch and single messages, keyed); a consumer with the
// key decrypts; consumers without it act as their crypto-failure action says (Fail: nothing
// delivered, Discard: acknowledged, Consume: the ciphertext with its encryption context); then
// a compaction, and a readCompacted reader with the key.
func encryption(s *session, out *result) error {
	keys, cleanup, err := keyPair()
	if err != nil {
		return err
	}
	defer cleanup()
	topic := s.topic("encryption")
	out.set("topic", topic)
	subs := map[string]pulsar.Consumer{}
	for _, c := range []struct {
		name       string
		decryption *pulsar.MessageDecryptionInfo
	}{
		{"withKey", &pulsar.MessageDecryptionInfo{KeyReader: keys}},
		{"fail", &pulsar.MessageDecryptionInfo{ConsumerCryptoFailureAction: crypto.ConsumerCryptoFailureActionFail}},
		{"discard", &pulsar.MessageDecryptionInfo{ConsumerCryptoFailureAction: crypto.ConsumerCryptoFailureActionDiscard}},
		{"consume", &pulsar.MessageDecryptionInfo{ConsumerCryptoFailureAction: crypto.ConsumerCryptoFailureActionConsume}},
	} {
		consumer, err := s.client.Subscribe(pulsar.ConsumerOptions{
			Topic:                       topic,
			SubscriptionName:            c.name,
			SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
			Decryption:                  c.decryption,
		})
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		defer consumer.Close()
		subs[c.name] = consumer
	}
	encrypting := &pulsar.ProducerEncryptionInfo{KeyReader: keys, Keys: []string{keyName}}
	batched, err := s.client.CreateProducer(pulsar.ProducerOptions{
		Topic:                   topic,
		Encryption:              encrypting,
		BatchingMaxMessages:     3,
		BatchingMaxPublishDelay: time.Hour,
	})
	if err != nil {
		return err
	}
	var sent []map[string]any
	batch := []*pulsar.ProducerMessage{
		{Key: "k1", Payload: []byte("secret-1a")},
		{Key: "k2", Payload: []byte("secret-2a")},
		{Key: "k1", Payload: []byte("secret-1b")},
	}
	got, err := sendAll(batched, batch)
	batched.Close()
	if err != nil {
		return err
	}
	for i, m := range batch {
		sent = append(sent, sentNode(m.Key, string(m.Payload), got[i]))
	}
	single, err := s.client.CreateProducer(pulsar.ProducerOptions{Topic: topic, Encryption: encrypting, DisableBatching: true})
	if err != nil {
		return err
	}
	for _, m := range []*pulsar.ProducerMessage{
		{Key: "k2", Payload: []byte("secret-2b")},
		{Key: "k3", Payload: []byte("secret-3")},
	} {
		at, err := send(single, m)
		if err != nil {
			single.Close()
			return err
		}
		sent = append(sent, sentNode(m.Key, string(m.Payload), at))
	}
	single.Close()
	out.set("sent", sent)

	var decrypted []map[string]any
	for range sent {
		m, err := receive(subs["withKey"])
		if err != nil {
			out.set("withKey", decrypted)
			return err
		}
		subs["withKey"].Ack(m)
		decrypted = append(decrypted, describe(m))
	}
	out.set("withKey", decrypted)
	out.set("withKeyMore", nothingMore(subs["withKey"]))
	// Consume: each entry as it is stored, undecrypted: the batch as one message.
	var raw []map[string]any
	for i := 0; i < 3; i++ {
		m, err := receive(subs["consume"])
		if err != nil {
			break
		}
		subs["consume"].Ack(m)
		d := describe(m)
		if ctx := m.GetEncryptionContext(); ctx != nil {
			names := []string{}
			for name := range ctx.Keys {
				names = append(names, name)
			}
			d["encryption"] = map[string]any{"keys": names, "algorithm": ctx.Algorithm, "batchSize": ctx.BatchSize}
		}
		raw = append(raw, d)
	}
	out.set("consume", raw)
	out.set("fail", nothingMore(subs["fail"]))
	out.set("discard", nothingMore(subs["discard"]))

	if err := s.compact(topic); err != nil {
		return err
	}
	r, err := s.client.CreateReader(pulsar.ReaderOptions{
		Topic:          topic,
		StartMessageID: pulsar.EarliestMessageID(),
		ReadCompacted:  true,
		Decryption:     &pulsar.MessageDecryptionInfo{KeyReader: keys},
	})
	if err != nil {
		return err
	}
	defer r.Close()
	compacted, err := readAll(r)
	out.set("compactedReader", compacted)
	return err
}

// dlqInitial: a Shared consumer whose dead letter policy names an initial subscription; the
// messages it gives up on go to the dead letter topic, where a consumer that subscribes only
// afterwards (at the latest position, the default) finds them kept for that subscription.
func dlqInitial(s *session, out *result) error {
	topic := s.topic("dlq-source")
	dlq := s.topic("dlq")
	out.set("topic", topic)
	out.set("dlq", dlq)
	consumer, err := s.client.Subscribe(pulsar.ConsumerOptions{
		Topic:               topic,
		SubscriptionName:    "work",
		Type:                pulsar.Shared,
		NackRedeliveryDelay: 100 * time.Millisecond,
		DLQ: &pulsar.DLQPolicy{
			MaxDeliveries:           2,
			DeadLetterTopic:         dlq,
			InitialSubscriptionName: "audit",
		},
	})
	if err != nil {
		return err
	}
	defer consumer.Close()
	p, err := s.unbatched(topic)
	if err != nil {
		return err
	}
	defer p.Close()
	for _, v := range []string{"poison-1", "poison-2"} {
		if _, err := send(p, &pulsar.ProducerMessage{Payload: []byte(v)}); err != nil {
			return err
		}
	}
	deliveries := 0
	for deliveries < 4 {
		m, err := receive(consumer)
		if err != nil {
			break
		}
		deliveries++
		consumer.Nack(m)
	}
	out.set("deliveries", deliveries)
	// The dead letter producer writes asynchronously, once it has made its topic: wait (10 s at
	// most) until the kept messages show in the initial subscription's backlog.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		status, body, err := s.request(http.MethodGet, adminPath(dlq)+"/stats", "")
		if err != nil || status != http.StatusOK {
			continue
		}
		var stats utils.TopicStats
		if json.Unmarshal([]byte(body), &stats) == nil && stats.Subscriptions["audit"].MsgBacklog >= 2 {
			break
		}
	}
	late, err := s.client.Subscribe(pulsar.ConsumerOptions{Topic: dlq, SubscriptionName: "audit"})
	if err != nil {
		return err
	}
	defer late.Close()
	var kept []map[string]any
	for i := 0; i < 2; i++ {
		m, err := receive(late)
		if err != nil {
			out.set("kept", kept)
			return err
		}
		late.Ack(m)
		kept = append(kept, describe(m))
	}
	out.set("kept", kept)
	return nil
}

// clientStats: a producer and a consumer with names and properties; the topic's stats, as
// pulsaradmin's TopicStats parses them, list both with their client's facts.
func clientStats(s *session, out *result) error {
	topic := s.topic("client-stats")
	out.set("topic", topic)
	p, err := s.client.CreateProducer(pulsar.ProducerOptions{
		Topic:      topic,
		Name:       "go-stats-producer",
		Properties: map[string]string{"app": "go"},
	})
	if err != nil {
		return err
	}
	defer p.Close()
	c, err := s.client.Subscribe(pulsar.ConsumerOptions{
		Topic:            topic,
		SubscriptionName: "stats",
		Name:             "go-stats-consumer",
		Properties:       map[string]string{"team": "go"},
	})
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := send(p, &pulsar.ProducerMessage{Payload: []byte("x")}); err != nil {
		return err
	}
	status, body, err := s.request(http.MethodGet, adminPath(topic)+"/stats", "")
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("stats: %d %s", status, body)
	}
	var stats utils.TopicStats
	if err := json.Unmarshal([]byte(body), &stats); err != nil {
		return fmt.Errorf("pulsaradmin's TopicStats does not parse the stats: %w: %s", err, body)
	}
	var publishers []map[string]any
	for _, pub := range stats.Publishers {
		publishers = append(publishers, map[string]any{
			"producerName":   pub.ProducerName,
			"producerId":     pub.ProducerID,
			"accessMode":     string(pub.AccessModel),
			"address":        pub.Address,
			"connectedSince": pub.ConnectedSince,
			"clientVersion":  pub.ClientVersion,
			"metadata":       pub.Metadata,
		})
	}
	out.set("publishers", publishers)
	var consumers []map[string]any
	for _, con := range stats.Subscriptions["stats"].Consumers {
		consumers = append(consumers, map[string]any{
			"consumerName":   con.ConsumerName,
			"address":        con.Address,
			"connectedSince": con.ConnectedSince,
			"clientVersion":  con.ClientVersion,
			"metadata":       con.Metadata,
		})
	}
	out.set("consumers", consumers)
	return nil
}
