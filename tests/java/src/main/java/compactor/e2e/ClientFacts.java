package compactor.e2e;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.net.URI;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.security.KeyPair;
import java.security.KeyPairGenerator;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.ConsumerCryptoFailureAction;
import org.apache.pulsar.client.api.CryptoKeyReader;
import org.apache.pulsar.client.api.DeadLetterPolicy;
import org.apache.pulsar.client.api.EncryptionKeyInfo;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.ProducerAccessMode;
import org.apache.pulsar.client.api.Reader;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;
import org.apache.pulsar.common.policies.data.ConsumerStats;
import org.apache.pulsar.common.policies.data.PublisherStats;
import org.apache.pulsar.common.policies.data.stats.TopicStatsImpl;
import org.apache.pulsar.common.util.ObjectMapperFactory;

/**
 * Scenarios of issue 51 with the Java client: end-to-end encryption (a key pair made here), a
 * dead letter policy with an initial subscription, topic stats as the admin client parses them,
 * and a fenced producer coming back on its connection. Registered in {@link Scenarios}; judged by
 * tests/e2e/test_go_java_client_facts.py.
 */
final class ClientFacts {

    private static final String KEY_NAME = "java-rsa";

    private ClientFacts() {}

    /** A key reader over a fresh RSA pair, as PEM (X.509 public, PKCS#8 private). */
    private static CryptoKeyReader keyPair() throws Exception {
        KeyPairGenerator generator = KeyPairGenerator.getInstance("RSA");
        generator.initialize(2048);
        KeyPair pair = generator.generateKeyPair();
        byte[] pub = pem("PUBLIC KEY", pair.getPublic().getEncoded());
        byte[] priv = pem("PRIVATE KEY", pair.getPrivate().getEncoded());
        return new CryptoKeyReader() {
            @Override
            public EncryptionKeyInfo getPublicKey(String keyName, Map<String, String> metadata) {
                return new EncryptionKeyInfo(pub, null);
            }

            @Override
            public EncryptionKeyInfo getPrivateKey(String keyName, Map<String, String> metadata) {
                return new EncryptionKeyInfo(priv, null);
            }
        };
    }

    private static byte[] pem(String type, byte[] der) {
        String body = Base64.getMimeEncoder(64, "\n".getBytes(StandardCharsets.US_ASCII)).encodeToString(der);
        return ("-----BEGIN " + type + "-----\n" + body + "\n-----END " + type + "-----\n")
                .getBytes(StandardCharsets.US_ASCII);
    }

    /**
     * An encrypting producer (a batch and single messages, keyed); a consumer with the key
     * decrypts; consumers without it act as their crypto-failure action says; then a compaction
     * and a readCompacted reader with the key.
     */
    static void encryption(Scenarios s, ObjectNode out) throws Exception {
        CryptoKeyReader keys = keyPair();
        String topic = s.topic("encryption");
        out.put("topic", topic);
        Map<String, Consumer<byte[]>> subs = new LinkedHashMap<>();
        for (String name : List.of("withKey", "fail", "discard", "consume")) {
            var builder = s.client.newConsumer()
                    .topic(topic)
                    .subscriptionName(name)
                    .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest);
            switch (name) {
                case "withKey" -> builder.cryptoKeyReader(keys);
                case "fail" -> builder.cryptoFailureAction(ConsumerCryptoFailureAction.FAIL);
                case "discard" -> builder.cryptoFailureAction(ConsumerCryptoFailureAction.DISCARD);
                default -> builder.cryptoFailureAction(ConsumerCryptoFailureAction.CONSUME);
            }
            subs.put(name, builder.subscribe());
        }
        try {
            ArrayNode sent = out.putArray("sent");
            try (Producer<byte[]> batched = s.client.newProducer()
                    .topic(topic)
                    .addEncryptionKey(KEY_NAME)
                    .cryptoKeyReader(keys)
                    .enableBatching(true)
                    .batchingMaxMessages(3)
                    .batchingMaxPublishDelay(1, TimeUnit.HOURS)
                    .create()) {
                String[][] batch = {{"k1", "secret-1a"}, {"k2", "secret-2a"}, {"k1", "secret-1b"}};
                List<java.util.concurrent.CompletableFuture<MessageId>> ids = new java.util.ArrayList<>();
                for (String[] m : batch) {
                    ids.add(batched.newMessage().key(m[0]).value(Scenarios.bytes(m[1])).sendAsync());
                }
                batched.flush();
                for (int i = 0; i < batch.length; i++) {
                    sent.add(Scenarios.sentNode(batch[i][0], batch[i][1], ids.get(i).get(30, TimeUnit.SECONDS)));
                }
            }
            try (Producer<byte[]> single = s.client.newProducer()
                    .topic(topic)
                    .addEncryptionKey(KEY_NAME)
                    .cryptoKeyReader(keys)
                    .enableBatching(false)
                    .create()) {
                for (String[] m : new String[][] {{"k2", "secret-2b"}, {"k3", "secret-3"}}) {
                    sent.add(Scenarios.sentNode(m[0], m[1], single.newMessage().key(m[0]).value(Scenarios.bytes(m[1])).send()));
                }
            }
            ArrayNode decrypted = out.putArray("withKey");
            for (int i = 0; i < sent.size(); i++) {
                Message<byte[]> m = s.receive(subs.get("withKey"));
                subs.get("withKey").acknowledge(m);
                decrypted.add(Scenarios.describe(m));
            }
            ArrayNode raw = out.putArray("consume");
            for (int i = 0; i < 3; i++) {
                Message<byte[]> m = subs.get("consume").receive(Scenarios.QUIET_MS * 4, TimeUnit.MILLISECONDS);
                if (m == null) {
                    break;
                }
                subs.get("consume").acknowledge(m);
                ObjectNode n = Scenarios.describe(m);
                m.getEncryptionCtx().ifPresent(ctx -> {
                    ObjectNode e = n.putObject("encryption");
                    e.put("batchSize", ctx.getBatchSize().orElse(0));
                    ArrayNode names = e.putArray("keys");
                    ctx.getKeys().keySet().forEach(names::add);
                });
                raw.add(n);
            }
            out.set("fail", Scenarios.describeOrNull(subs.get("fail").receive(Scenarios.QUIET_MS, TimeUnit.MILLISECONDS)));
            out.set("discard", Scenarios.describeOrNull(subs.get("discard").receive(Scenarios.QUIET_MS, TimeUnit.MILLISECONDS)));
        } finally {
            for (Consumer<byte[]> c : subs.values()) {
                c.close();
            }
        }
        s.compact(topic);
        try (Reader<byte[]> r = s.client.newReader()
                .topic(topic)
                .startMessageId(MessageId.earliest)
                .readCompacted(true)
                .cryptoKeyReader(keys)
                .create()) {
            out.set("compactedReader", Scenarios.readAll(r));
        }
    }

    /**
     * A Shared consumer whose dead letter policy names an initial subscription; a consumer that
     * subscribes to the dead letter topic only afterwards (at the latest position) finds the
     * messages kept for it.
     */
    static void dlqInitial(Scenarios s, ObjectNode out) throws Exception {
        String topic = s.topic("dlq-source");
        String dlq = s.topic("dlq");
        out.put("topic", topic);
        out.put("dlq", dlq);
        try (Consumer<byte[]> consumer = s.client.newConsumer()
                .topic(topic)
                .subscriptionName("work")
                .subscriptionType(SubscriptionType.Shared)
                .negativeAckRedeliveryDelay(100, TimeUnit.MILLISECONDS)
                .deadLetterPolicy(DeadLetterPolicy.builder()
                        .maxRedeliverCount(1)
                        .deadLetterTopic(dlq)
                        .initialSubscriptionName("audit")
                        .build())
                .subscribe();
                Producer<byte[]> p = s.client.newProducer().topic(topic).enableBatching(false).create()) {
            for (String v : List.of("poison-1", "poison-2")) {
                p.send(Scenarios.bytes(v));
            }
            int deliveries = 0;
            while (deliveries < 4) {
                Message<byte[]> m = consumer.receive(10, TimeUnit.SECONDS);
                if (m == null) {
                    break;
                }
                deliveries++;
                consumer.negativeAcknowledge(m);
            }
            out.put("deliveries", deliveries);
            // The dead letter producer writes asynchronously, once it has made its topic: wait
            // (10 s at most) until the kept messages show in the initial subscription's backlog.
            String stats = dlq.replace("persistent://", "/admin/v2/persistent/") + "/stats";
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (System.nanoTime() < deadline) {
                HttpResponse<String> got = s.http.send(
                        HttpRequest.newBuilder(URI.create(s.httpUrl + stats)).GET().build(),
                        HttpResponse.BodyHandlers.ofString());
                if (got.statusCode() == 200
                        && Scenarios.JSON.readTree(got.body()).path("subscriptions").path("audit").path("msgBacklog").asInt() >= 2) {
                    break;
                }
                Thread.sleep(100);
            }
        }
        try (Consumer<byte[]> late = s.client.newConsumer().topic(dlq).subscriptionName("audit").subscribe()) {
            ArrayNode kept = out.putArray("kept");
            for (int i = 0; i < 2; i++) {
                Message<byte[]> m = s.receive(late);
                late.acknowledge(m);
                kept.add(Scenarios.describe(m));
            }
        }
    }

    /** A named producer and consumer with properties; the stats as the admin client parses them. */
    static void clientStats(Scenarios s, ObjectNode out) throws Exception {
        String topic = s.topic("client-stats");
        out.put("topic", topic);
        try (Producer<byte[]> p = s.client.newProducer()
                        .topic(topic)
                        .producerName("java-stats-producer")
                        .property("app", "java")
                        .create();
                Consumer<byte[]> c = s.client.newConsumer()
                        .topic(topic)
                        .subscriptionName("stats")
                        .consumerName("java-stats-consumer")
                        .property("team", "java")
                        .subscribe()) {
            p.send(Scenarios.bytes("x"));
            String path = topic.replace("persistent://", "/admin/v2/persistent/") + "/stats";
            HttpResponse<String> got = s.http.send(
                    HttpRequest.newBuilder(URI.create(s.httpUrl + path)).GET().build(),
                    HttpResponse.BodyHandlers.ofString());
            if (got.statusCode() != 200) {
                throw new AssertionError("GET " + path + ": " + got.statusCode() + " " + got.body());
            }
            // As PulsarAdmin reads it: Pulsar's own mapper and stats classes.
            TopicStatsImpl stats = ObjectMapperFactory.getMapper().reader().readValue(got.body(), TopicStatsImpl.class);
            ArrayNode publishers = out.putArray("publishers");
            for (PublisherStats pub : stats.getPublishers()) {
                ObjectNode n = publishers.addObject();
                n.put("producerName", pub.getProducerName());
                n.put("producerId", pub.getProducerId());
                n.put("accessMode", String.valueOf(pub.getAccessMode()));
                n.put("address", pub.getAddress());
                n.put("connectedSince", pub.getConnectedSince());
                n.put("clientVersion", pub.getClientVersion());
                ObjectNode md = n.putObject("metadata");
                if (pub.getMetadata() != null) {
                    pub.getMetadata().forEach(md::put);
                }
            }
            ArrayNode consumers = out.putArray("consumers");
            for (ConsumerStats con : stats.getSubscriptions().get("stats").getConsumers()) {
                ObjectNode n = consumers.addObject();
                n.put("consumerName", con.getConsumerName());
                n.put("address", con.getAddress());
                n.put("connectedSince", con.getConnectedSince());
                n.put("clientVersion", con.getClientVersion());
                ObjectNode md = n.putObject("metadata");
                if (con.getMetadata() != null) {
                    con.getMetadata().forEach(md::put);
                }
            }
        }
    }

    /**
     * A producer fenced by an ExclusiveWithFencing one of the same client (on the same
     * connection) registers again under its own producer id once that one is gone; its sends
     * go through.
     */
    static void reconnect(Scenarios s, ObjectNode out) throws Exception {
        String topic = s.topic("reconnect");
        out.put("topic", topic);
        try (Producer<byte[]> shared = s.client.newProducer()
                .topic(topic)
                .producerName("java-shared")
                .enableBatching(false)
                .create()) {
            shared.send(Scenarios.bytes("before"));
            try (Producer<byte[]> fencing = s.client.newProducer()
                    .topic(topic)
                    .producerName("java-fencing")
                    .accessMode(ProducerAccessMode.ExclusiveWithFencing)
                    .enableBatching(false)
                    .create()) {
                fencing.send(Scenarios.bytes("fenced"));
            }
            MessageId after = shared.sendAsync(Scenarios.bytes("after")).get(40, TimeUnit.SECONDS);
            out.put("after", Scenarios.id(after));
        }
        try (Reader<byte[]> r = s.client.newReader().topic(topic).startMessageId(MessageId.earliest).create()) {
            ArrayNode values = out.putArray("values");
            for (var m : Scenarios.readAll(r)) {
                values.add(new String(Base64.getDecoder().decode(m.get("value").asText()), StandardCharsets.UTF_8));
            }
        }
    }
}
