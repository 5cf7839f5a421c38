package compactor.e2e;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.admin.PulsarAdmin;
import org.apache.pulsar.client.admin.PulsarAdminException;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.MessageIdAdv;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.common.partition.PartitionedTopicMetadata;

/**
 * Scenarios of Pulsar's Java admin client (pulsar-client-admin 4.0.7) against the service, as an
 * operator's tool drives it (issue 51): its requests, bodies and content types as it sends them
 * to Pulsar. Registered in {@link Scenarios}, judged by tests/e2e/test_go_java_admin.py.
 */
final class AdminScenarios {

    private AdminScenarios() {}

    private static PulsarAdmin admin(Scenarios s) throws Exception {
        return PulsarAdmin.builder().serviceHttpUrl(s.httpUrl).build();
    }

    /**
     * A partitioned topic created with properties (the partitioned-topic-metadata body) and one
     * without (a bare number), their metadata, one grown, the lists, one deleted.
     */
    static void partitions(Scenarios s, ObjectNode out) throws Exception {
        try (PulsarAdmin admin = admin(s)) {
            String withProps = s.topic("admin-props");
            String plain = s.topic("admin-plain");
            out.put("withProperties", withProps);
            out.put("plain", plain);
            admin.topics().createPartitionedTopic(withProps, 2, Map.of("owner", "java", "tier", "gold"));
            admin.topics().createPartitionedTopic(plain, 1);
            PartitionedTopicMetadata md = admin.topics().getPartitionedTopicMetadata(withProps);
            out.put("metadataPartitions", md.partitions);
            ObjectNode props = out.putObject("metadataProperties");
            if (md.properties != null) {
                md.properties.forEach(props::put);
            }
            admin.topics().updatePartitionedTopic(plain, 3);
            out.put("grownPartitions", admin.topics().getPartitionedTopicMetadata(plain).partitions);
            out.put("createAgain", error(() -> admin.topics().createPartitionedTopic(plain, 2)));
            out.set("partitionedListed", mine(admin.topics().getPartitionedTopicList("public/default"), s));
            out.set("listed", mine(admin.topics().getList("public/default"), s));
            out.set("namespaceTopics", mine(admin.namespaces().getTopics("public/default"), s));
            out.put("missingNamespaceTopics",
                    error(() -> admin.namespaces().getTopics("public/java-missing-" + s.run)));
            admin.topics().deletePartitionedTopic(plain);
            out.set("partitionedAfterDelete", mine(admin.topics().getPartitionedTopicList("public/default"), s));
        }
    }

    /** Messages sent alone and in a batch, read back by id; an id that does not exist. */
    static void messages(Scenarios s, ObjectNode out) throws Exception {
        String topic = s.topic("admin-messages");
        out.put("topic", topic);
        MessageId single;
        try (Producer<byte[]> p = s.client.newProducer().topic(topic).enableBatching(false).create()) {
            single = p.newMessage()
                    .key("k1")
                    .value("alone".getBytes(StandardCharsets.UTF_8))
                    .property("color", "red")
                    .property("Mixed-Case", "v")
                    .eventTime(1234)
                    .send();
        }
        List<MessageId> batch = new ArrayList<>();
        try (Producer<byte[]> p = s.batchedProducer(topic, 3)) {
            List<CompletableFuture<MessageId>> pending = new ArrayList<>();
            for (int i = 0; i < 3; i++) {
                pending.add(p.newMessage()
                        .key("b" + i)
                        .value(("member" + i).getBytes(StandardCharsets.UTF_8))
                        .property("i", String.valueOf(i))
                        .sendAsync());
            }
            p.flush();
            for (CompletableFuture<MessageId> f : pending) {
                batch.add(f.get(30, TimeUnit.SECONDS));
            }
        }
        out.put("singleSent", Scenarios.id(single));
        ArrayNode sent = out.putArray("batchSent");
        batch.forEach(id -> sent.add(Scenarios.id(id)));
        try (PulsarAdmin admin = admin(s)) {
            MessageIdAdv one = (MessageIdAdv) single;
            out.set("single", describe(admin.topics().getMessageById(topic, one.getLedgerId(), one.getEntryId())));
            MessageIdAdv first = (MessageIdAdv) batch.get(0);
            ArrayNode got = out.putArray("batch");
            for (Message<byte[]> m : admin.topics().getMessagesById(topic, first.getLedgerId(), first.getEntryId())) {
                got.add(describe(m));
            }
            out.put("missing", error(() -> admin.topics().getMessagesById(
                    topic, one.getLedgerId(), one.getEntryId() + 1000)));
        }
    }

    /** A lookup of a topic that does not exist yet, its stats then; one in a missing namespace. */
    static void lookup(Scenarios s, ObjectNode out) throws Exception {
        try (PulsarAdmin admin = admin(s)) {
            String topic = s.topic("admin-lookup");
            out.put("topic", topic);
            out.put("brokerUrl", admin.lookups().lookupTopic(topic));
            out.put("publishers", admin.topics().getStats(topic).getPublishers().size());
            out.put("missingNamespace",
                    error(() -> admin.lookups().lookupTopic("persistent://public/java-missing-" + s.run + "/t")));
        }
    }

    private static ObjectNode describe(Message<byte[]> m) {
        ObjectNode n = Scenarios.JSON.createObjectNode();
        n.put("id", Scenarios.id(m.getMessageId()));
        n.put("key", m.hasKey() ? m.getKey() : null);
        n.put("value", new String(m.getValue(), StandardCharsets.UTF_8));
        ObjectNode props = n.putObject("properties");
        m.getProperties().forEach(props::put);
        n.put("publishTime", m.getPublishTime());
        n.put("eventTime", m.getEventTime());
        n.put("producerName", m.getProducerName());
        return n;
    }

    private static ArrayNode mine(List<String> names, Scenarios s) {
        ArrayNode kept = Scenarios.JSON.createArrayNode();
        names.stream().filter(n -> n.contains(s.run)).sorted().forEach(kept::add);
        return kept;
    }

    interface AdminCall {
        void call() throws Exception;
    }

    /** The admin exception's class and status (null when the call succeeded). */
    private static String error(AdminCall call) {
        try {
            call.call();
            return null;
        } catch (PulsarAdminException e) {
            return e.getClass().getSimpleName() + " " + e.getStatusCode() + " " + e.getHttpError();
        } catch (Exception e) {
            return e.getClass().getSimpleName() + " " + e.getMessage();
        }
    }
}
