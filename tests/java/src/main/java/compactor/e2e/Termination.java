package compactor.e2e;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.admin.PulsarAdmin;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.MessageIdAdv;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.Reader;
import org.apache.pulsar.common.policies.data.BacklogQuota;
import org.apache.pulsar.common.policies.data.BacklogQuota.BacklogQuotaType;
import org.apache.pulsar.common.policies.data.BacklogQuota.RetentionPolicy;

/**
 * Topic termination and backlog quotas through the Java admin client ({@code PulsarAdmin}) and
 * what the Java client sees of them: a consumer and a reader that read a terminated topic to
 * its end hear so ({@code hasReachedEndOfTopic}), producers are refused; a producer of a topic
 * over its backlog quota is refused. Judged by tests/e2e/test_go_java_termination.py.
 */
final class Termination {

    private Termination() {}

    private static PulsarAdmin admin(Scenarios s) throws Exception {
        return PulsarAdmin.builder().serviceHttpUrl(s.httpUrl).build();
    }

    private static String error(Exception e) {
        return e.getClass().getSimpleName() + ": " + e.getMessage();
    }

    /** Terminate a topic with a consumer on it: it reads to the end and hears so; producers are refused. */
    static void terminate(Scenarios s, ObjectNode out) throws Exception {
        String topic = s.topic("terminate");
        out.put("topic", topic);
        try (PulsarAdmin admin = admin(s);
                Producer<byte[]> p = s.client.newProducer().topic(topic).enableBatching(false).create();
                Consumer<byte[]> c = s.subscribe(topic, "s", false)) {
            ArrayNode sent = out.putArray("sent");
            for (int i = 0; i < 3; i++) {
                sent.add(Scenarios.id(p.send(("t" + i).getBytes(StandardCharsets.UTF_8))));
            }
            MessageIdAdv last = (MessageIdAdv) admin.topics().terminateTopic(topic);
            out.put("terminated", last.getLedgerId() + ":" + last.getEntryId());
            out.put("endBeforeReading", c.hasReachedEndOfTopic());
            try {
                p.send("late".getBytes(StandardCharsets.UTF_8));
                out.put("sendAfter", (String) null);
            } catch (Exception e) {
                out.put("sendAfter", error(e));
            }
            try (Producer<byte[]> again = s.client.newProducer().topic(topic).create()) {
                out.put("newProducer", (String) null);
            } catch (Exception e) {
                out.put("newProducer", error(e));
            }
            ArrayNode got = out.putArray("received");
            for (int i = 0; i < 3; i++) {
                Message<byte[]> m = s.receive(c);
                got.add(new String(m.getValue(), StandardCharsets.UTF_8));
                c.acknowledge(m);
            }
            out.put("consumerReachedEnd", until(c::hasReachedEndOfTopic));
            try (Reader<byte[]> r = s.client.newReader().topic(topic).startMessageId(MessageId.earliest).create()) {
                out.set("read", Scenarios.readAll(r));
                out.put("readerReachedEnd", until(r::hasReachedEndOfTopic));
            }
        }
    }

    /** The admin client's namespace and topic backlog quota calls, and a producer over the quota. */
    static void quotas(Scenarios s, ObjectNode out) throws Exception {
        String ns = "public/java-quota-" + s.run;
        String topic = "persistent://" + ns + "/over";
        out.put("topic", topic);
        try (PulsarAdmin admin = admin(s)) {
            admin.namespaces().createNamespace(ns);
            out.put("namespaceBefore", admin.namespaces().getBacklogQuotaMap(ns).size());
            admin.namespaces().setBacklogQuota(ns, BacklogQuota.builder()
                    .limitSize(1000)
                    .retentionPolicy(RetentionPolicy.producer_exception)
                    .build(), BacklogQuotaType.destination_storage);
            out.set("namespaceSet", quotaMap(admin.namespaces().getBacklogQuotaMap(ns)));
            admin.namespaces().removeBacklogQuota(ns, BacklogQuotaType.destination_storage);
            out.put("namespaceRemoved", admin.namespaces().getBacklogQuotaMap(ns).size());
            s.subscribe(topic, "slow", false).close(); // the subscription stays; its backlog grows
            try (Producer<byte[]> p = s.client.newProducer().topic(topic).enableBatching(false).create()) {
                for (int i = 0; i < 5; i++) {
                    p.send(new byte[200]);
                }
            }
            admin.topicPolicies().setBacklogQuota(topic, BacklogQuota.builder()
                    .limitSize(500)
                    .retentionPolicy(RetentionPolicy.producer_exception)
                    .build(), BacklogQuotaType.destination_storage);
            out.set("topicSet", quotaMap(admin.topicPolicies().getBacklogQuotaMap(topic)));
            try (Producer<byte[]> p = s.client.newProducer().topic(topic).create()) {
                out.put("refused", (String) null);
            } catch (Exception e) {
                out.put("refused", error(e));
            }
            admin.topicPolicies().removeBacklogQuota(topic, BacklogQuotaType.destination_storage);
            try (Producer<byte[]> p = s.client.newProducer().topic(topic).create()) {
                out.put("afterRemove", (String) null);
            } catch (Exception e) {
                out.put("afterRemove", error(e));
            }
        }
    }

    private static ObjectNode quotaMap(Map<BacklogQuotaType, BacklogQuota> quotas) {
        ObjectNode n = Scenarios.JSON.createObjectNode();
        quotas.forEach((type, q) -> n.putObject(type.name())
                .put("limitSize", q.getLimitSize())
                .put("limitTime", q.getLimitTime())
                .put("policy", q.getPolicy().name()));
        return n;
    }

    interface Check {
        boolean holds() throws Exception;
    }

    /** Whether ``check`` holds within 10 s. */
    private static boolean until(Check check) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!check.holds()) {
            if (System.nanoTime() > deadline) {
                return false;
            }
            Thread.sleep(100);
        }
        return true;
    }
}
