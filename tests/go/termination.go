package main

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsaradmin/pkg/utils"
)

func errText(err error) any {
	if err == nil {
		return nil
	}
	return err.Error()
}

// terminate: pulsaradmin terminates a topic with a producer and a consumer on it; the producer's
// sends then fail and a new producer is refused, the consumer and a reader still read all that
// was there, and terminating again answers the same id.
func terminate(s *session, out *result) error {
	topic := s.topic("terminate")
	out.set("topic", topic)
	p, err := s.unbatched(topic)
	if err != nil {
		return err
	}
	defer p.Close()
	c, err := s.subscribe(topic, "s", pulsar.Exclusive)
	if err != nil {
		return err
	}
	defer c.Close()
	sent := []string{}
	for i := 0; i < 3; i++ {
		m, err := send(p, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("t%d", i))})
		if err != nil {
			return err
		}
		sent = append(sent, id(m))
	}
	out.set("sent", sent)
	admin, err := s.admin()
	if err != nil {
		return err
	}
	name, err := utils.GetTopicName(topic)
	if err != nil {
		return err
	}
	last, err := admin.Topics().Terminate(*name)
	if err != nil {
		return fmt.Errorf("Terminate: %w", err)
	}
	out.set("terminated", fmt.Sprintf("%d:%d", last.LedgerID, last.EntryID))
	again, err := admin.Topics().Terminate(*name)
	if err != nil {
		return fmt.Errorf("Terminate again: %w", err)
	}
	out.set("terminatedAgain", fmt.Sprintf("%d:%d", again.LedgerID, again.EntryID))
	// The producer is closed by the service and refused as it reconnects: a send fails soon.
	var sendErr error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if _, sendErr = send(p, &pulsar.ProducerMessage{Payload: []byte("late")}); sendErr != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	out.set("sendAfter", errText(sendErr))
	_, err = s.unbatched(topic)
	out.set("newProducer", errText(err))
	got := []string{}
	for i := 0; i < 3; i++ {
		m, err := receive(c)
		if err != nil {
			return err
		}
		got = append(got, string(m.Payload()))
		if err := c.Ack(m); err != nil {
			return err
		}
	}
	out.set("received", got)
	out.set("receivedExtra", nothingMore(c))
	r, err := s.client.CreateReader(pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.EarliestMessageID()})
	if err != nil {
		return err
	}
	defer r.Close()
	read, err := readAll(r)
	out.set("read", read)
	return err
}

// backlogquota: pulsaradmin's namespace and topic backlog quota calls, and what a producer of a
// topic over its quota hears: refused (producer_exception) or held (producer_request_hold).
func backlogQuota(s *session, out *result) error {
	admin, err := s.admin()
	if err != nil {
		return err
	}
	ns := "public/go-quota-" + s.run
	if err := admin.Namespaces().CreateNamespace(ns); err != nil {
		return fmt.Errorf("CreateNamespace: %w", err)
	}
	empty, err := admin.Namespaces().GetBacklogQuotaMap(ns)
	if err != nil {
		return err
	}
	out.set("namespaceBefore", empty)
	if err := admin.Namespaces().SetBacklogQuota(
		ns, utils.NewBacklogQuota(1000, -1, utils.ProducerException), utils.DestinationStorage,
	); err != nil {
		return fmt.Errorf("SetBacklogQuota: %w", err)
	}
	if err := admin.Namespaces().SetBacklogQuota(
		ns, utils.NewBacklogQuota(-1, 3600, utils.ConsumerBacklogEviction), utils.MessageAge,
	); err != nil {
		return fmt.Errorf("SetBacklogQuota message_age: %w", err)
	}
	set, err := admin.Namespaces().GetBacklogQuotaMap(ns)
	if err != nil {
		return err
	}
	out.set("namespaceSet", set)
	if err := admin.Namespaces().RemoveBacklogQuota(ns); err != nil {
		return fmt.Errorf("RemoveBacklogQuota: %w", err)
	}
	removed, err := admin.Namespaces().GetBacklogQuotaMap(ns)
	if err != nil {
		return err
	}
	out.set("namespaceRemoved", removed)

	topic := "persistent://" + ns + "/over"
	out.set("topic", topic)
	c, err := s.subscribe(topic, "slow", pulsar.Exclusive)
	if err != nil {
		return err
	}
	c.Close() // the subscription stays, and its backlog grows
	p, err := s.unbatched(topic)
	if err != nil {
		return err
	}
	for i := 0; i < 5; i++ {
		if _, err := send(p, &pulsar.ProducerMessage{Payload: []byte(strings.Repeat("x", 200))}); err != nil {
			p.Close()
			return err
		}
	}
	p.Close()
	name, err := utils.GetTopicName(topic)
	if err != nil {
		return err
	}
	if err := admin.Topics().SetBacklogQuota(
		*name, utils.NewBacklogQuota(500, -1, utils.ProducerException), utils.DestinationStorage,
	); err != nil {
		return fmt.Errorf("topic SetBacklogQuota: %w", err)
	}
	mine, err := admin.Topics().GetBacklogQuotaMap(*name, false)
	if err != nil {
		return err
	}
	out.set("topicSet", mine)
	_, err = s.unbatched(topic)
	out.set("refusedException", errText(err))
	if err := admin.Topics().SetBacklogQuota(
		*name, utils.NewBacklogQuota(500, -1, utils.ProducerRequestHold), utils.DestinationStorage,
	); err != nil {
		return err
	}
	_, err = s.unbatched(topic)
	out.set("refusedHold", errText(err))
	// The subscription skips its backlog: producers are welcome again.
	path := adminPath(topic) + "/subscription/slow/resetcursor"
	if status, body, err := s.request(http.MethodPost, path, `{"messageId": "latest"}`); err != nil || status != http.StatusNoContent {
		return fmt.Errorf("POST %s: %d %s %v", path, status, body, err)
	}
	again, err := s.unbatched(topic)
	out.set("afterCatchingUp", errText(err))
	if err == nil {
		again.Close()
	}
	if err := admin.Topics().RemoveBacklogQuota(*name, utils.DestinationStorage); err != nil {
		return fmt.Errorf("topic RemoveBacklogQuota: %w", err)
	}
	applied, err := admin.Topics().GetBacklogQuotaMap(*name, true)
	if err != nil {
		return err
	}
	out.set("topicApplied", applied)
	return nil
}
