package main

import (
	"fmt"
	"strings"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsaradmin"
	"github.com/apache/pulsar-client-go/pulsaradmin/pkg/utils"
)

// The admin scenarios (issue 51) drive Go's own admin client, pulsaradmin, as an operator's
// tool would: its requests, bodies and content types as it sends them to Pulsar.

func (s *session) admin() (pulsaradmin.Client, error) {
	return pulsaradmin.NewClient(&pulsaradmin.Config{WebServiceURL: s.httpURL})
}

// adminPartitions: a partitioned topic created with properties (the partitioned-topic-metadata
// body) and one without, their metadata read back, one grown, the namespace's topics listed
// (both of pulsaradmin's lists), one deleted.
func adminPartitions(s *session, out *result) error {
	admin, err := s.admin()
	if err != nil {
		return err
	}
	withProps, err := utils.GetTopicName(s.topic("admin-props"))
	if err != nil {
		return err
	}
	plain, err := utils.GetTopicName(s.topic("admin-plain"))
	if err != nil {
		return err
	}
	out.set("withProperties", withProps.String())
	out.set("plain", plain.String())
	if err := admin.Topics().CreateWithProperties(*withProps, 2, map[string]string{"owner": "go", "tier": "gold"}); err != nil {
		return fmt.Errorf("create with properties: %w", err)
	}
	if err := admin.Topics().Create(*plain, 1); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	md, err := admin.Topics().GetMetadata(*withProps)
	if err != nil {
		return err
	}
	out.set("metadataPartitions", md.Partitions)
	if err := admin.Topics().Update(*plain, 3); err != nil {
		return fmt.Errorf("update: %w", err)
	}
	grown, err := admin.Topics().GetMetadata(*plain)
	if err != nil {
		return err
	}
	out.set("grownPartitions", grown.Partitions)
	// A second create of the same name is refused, as Pulsar refuses it (409).
	out.set("createAgain", errorText(admin.Topics().Create(*plain, 2)))
	ns, err := utils.GetNamespaceName("public/default")
	if err != nil {
		return err
	}
	partitioned, nonPartitioned, err := admin.Topics().List(*ns)
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	out.set("partitionedListed", mine(partitioned, s.run))
	out.set("nonPartitionedListed", mine(nonPartitioned, s.run))
	topics, err := admin.Namespaces().GetTopics("public/default")
	if err != nil {
		return fmt.Errorf("namespace topics: %w", err)
	}
	out.set("namespaceTopics", mine(topics, s.run))
	missing, err := admin.Namespaces().GetTopics("public/go-missing-" + s.run)
	out.set("missingNamespaceTopics", missing)
	out.set("missingNamespaceError", errorText(err))
	if err := admin.Topics().Delete(*plain, false, false); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	after, _, err := admin.Topics().List(*ns)
	if err != nil {
		return err
	}
	out.set("partitionedAfterDelete", mine(after, s.run))
	return nil
}

// adminMessages: messages sent alone and in a batch by the client, then read back one by one by
// their ids with pulsaradmin's GetMessageByID / GetMessagesByID; an id that does not exist.
func adminMessages(s *session, out *result) error {
	admin, err := s.admin()
	if err != nil {
		return err
	}
	topic := s.topic("admin-messages")
	out.set("topic", topic)
	p, err := s.unbatched(topic)
	if err != nil {
		return err
	}
	single, err := send(p, &pulsar.ProducerMessage{
		Key: "k1", Payload: []byte("alone"), Properties: map[string]string{"color": "red", "Mixed-Case": "v"},
	})
	p.Close()
	if err != nil {
		return err
	}
	b, err := s.batched(topic, 3)
	if err != nil {
		return err
	}
	var messages []*pulsar.ProducerMessage
	for i := 0; i < 3; i++ {
		messages = append(messages, &pulsar.ProducerMessage{
			Key: fmt.Sprintf("b%d", i), Payload: []byte(fmt.Sprintf("member%d", i)),
			Properties: map[string]string{"i": fmt.Sprint(i)},
		})
	}
	batch, err := sendAll(b, messages)
	b.Close()
	if err != nil {
		return err
	}
	out.set("singleSent", id(single))
	out.set("batchSent", []string{id(batch[0]), id(batch[1]), id(batch[2])})
	name, err := utils.GetTopicName(topic)
	if err != nil {
		return err
	}
	m, err := admin.Subscriptions().GetMessageByID(*name, single.LedgerID(), single.EntryID())
	if err != nil {
		return fmt.Errorf("message by id: %w", err)
	}
	out.set("single", adminMessage(m))
	members, err := admin.Subscriptions().GetMessagesByID(*name, batch[0].LedgerID(), batch[0].EntryID())
	if err != nil {
		return fmt.Errorf("messages by id: %w", err)
	}
	got := []map[string]any{}
	for _, m := range members {
		got = append(got, adminMessage(m))
	}
	out.set("batch", got)
	_, err = admin.Subscriptions().GetMessageByID(*name, single.LedgerID(), single.EntryID()+1000)
	out.set("missingError", errorText(err))
	return nil
}

// adminLookup: pulsaradmin's lookup of a topic that does not exist yet (in a namespace that does),
// then the topic's stats; a lookup in a namespace that does not exist.
func adminLookup(s *session, out *result) error {
	admin, err := s.admin()
	if err != nil {
		return err
	}
	name, err := utils.GetTopicName(s.topic("admin-lookup"))
	if err != nil {
		return err
	}
	out.set("topic", name.String())
	found, err := admin.Topics().Lookup(*name)
	if err != nil {
		return fmt.Errorf("lookup: %w", err)
	}
	out.set("brokerUrl", found.BrokerURL)
	stats, err := admin.Topics().GetStats(*name)
	out.set("statsError", errorText(err))
	out.set("statsPublishers", len(stats.Publishers))
	missing, err := utils.GetTopicName("persistent://public/go-missing-" + s.run + "/t")
	if err != nil {
		return err
	}
	_, err = admin.Topics().Lookup(*missing)
	out.set("missingNamespaceError", errorText(err))
	return nil
}

func adminMessage(m *utils.Message) map[string]any {
	id := m.GetMessageID()
	return map[string]any{
		"id":         fmt.Sprintf("%d:%d:%d", id.LedgerID, id.EntryID, id.BatchIndex),
		"value":      string(m.GetPayload()),
		"properties": m.GetProperties(),
	}
}

// mine is the names of this run's topics among names (the shared namespace holds others').
func mine(names []string, run string) []string {
	kept := []string{}
	for _, n := range names {
		if strings.Contains(n, run) {
			kept = append(kept, n)
		}
	}
	return kept
}

func errorText(err error) any {
	if err == nil {
		return nil
	}
	return err.Error()
}
