package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/apache/pulsar-client-go/pulsar"
)

// order is the value of the schema scenario, for Go's JSON and Avro schemas alike.
type order struct {
	ID  string `json:"id" avro:"id"`
	Qty int    `json:"qty" avro:"qty"`
}

const orderSchema = `{"type": "record", "name": "Order", "namespace": "compactor.e2e",
  "fields": [{"name": "id", "type": "string"}, {"name": "qty", "type": "int"}]}`

// schemas: a producer with Go's JSON schema and one with its Avro schema, each on a topic of its
// own, and a consumer with the same schema that decodes what they sent; the schema each topic
// has afterwards, as REST gives it.
func schemas(s *session, out *result) error {
	for _, kind := range []struct {
		name   string
		schema func() pulsar.Schema
	}{
		{"json", func() pulsar.Schema { return pulsar.NewJSONSchema(orderSchema, nil) }},
		{"avro", func() pulsar.Schema { return pulsar.NewAvroSchema(orderSchema, nil) }},
	} {
		topic := s.topic("schema-" + kind.name)
		out.set(kind.name+"Topic", topic)
		// Batching (the default): Go's client writes the schema version into a batch's
		// metadata, and into an unbatched message's not at all (against Pulsar's broker too).
		p, err := s.client.CreateProducer(pulsar.ProducerOptions{Topic: topic, Schema: kind.schema()})
		if err != nil {
			return fmt.Errorf("%s producer: %w", kind.name, err)
		}
		for _, o := range []order{{"o1", 3}, {"o2", 5}} {
			if _, err := send(p, &pulsar.ProducerMessage{Key: o.ID, Value: o}); err != nil {
				p.Close()
				return fmt.Errorf("%s send: %w", kind.name, err)
			}
		}
		p.Close()
		c, err := s.client.Subscribe(pulsar.ConsumerOptions{
			Topic:                       topic,
			SubscriptionName:            "typed",
			SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
			Schema:                      kind.schema(),
		})
		if err != nil {
			return fmt.Errorf("%s consumer: %w", kind.name, err)
		}
		var got []map[string]any
		for i := 0; i < 2; i++ {
			m, err := receive(c)
			if err != nil {
				c.Close()
				return err
			}
			var o order
			if err := m.GetSchemaValue(&o); err != nil {
				c.Close()
				return fmt.Errorf("%s decode: %w", kind.name, err)
			}
			got = append(got, map[string]any{
				"key":           m.Key(),
				"id":            o.ID,
				"qty":           o.Qty,
				"schemaVersion": hex.EncodeToString(m.SchemaVersion()),
			})
			if err := c.Ack(m); err != nil {
				c.Close()
				return err
			}
		}
		c.Close()
		out.set(kind.name, got)
		status, body, err := s.request(http.MethodGet, "/admin/v2/schemas/"+strings.TrimPrefix(topic, "persistent://")+"/schema", "")
		if err != nil {
			return err
		}
		var registered map[string]any
		if status != http.StatusOK || json.Unmarshal([]byte(body), &registered) != nil {
			return fmt.Errorf("the %s schema over REST: %d %s", kind.name, status, body)
		}
		out.set(kind.name+"Registered", registered)
	}
	return nil
}
