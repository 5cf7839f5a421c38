package compactor.e2e;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.MessageIdAdv;
import org.apache.pulsar.client.api.MessageRouter;
import org.apache.pulsar.client.api.MessageRoutingMode;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Reader;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;
import org.apache.pulsar.client.api.TopicMetadata;
import org.apache.pulsar.client.api.schema.GenericRecord;

/**
 * Scenarios of Pulsar's Java client against a running service, in one JVM. Each scenario does
 * what an application does and records what it saw (message ids, keys, values) as JSON; the
 * Python tests (tests/e2e/test_java_client.py) judge it. The scenarios run side by side with
 * one client; one that throws or overruns its time records its error, and the others go on.
 *
 * <p>Usage: {@code Scenarios PULSAR_URL HTTP_URL OUT_JSON [SCENARIO...]} (all scenarios when
 * none is named). OUT_JSON is rewritten as each scenario ends: {"name": {...} | {"error": "..."}}.
 */
public final class Scenarios {

    static final ObjectMapper JSON = new ObjectMapper();
    private static final Duration RECEIVE = Duration.ofSeconds(10);
    // How long "nothing more arrives" is waited for, after everything expected did arrive.
    static final int QUIET_MS = 500;

    interface Scenario {
        void run(Scenarios s, ObjectNode out) throws Exception;
    }

    private static final Map<String, Scenario> SCENARIOS = new LinkedHashMap<>();
    // Seconds a scenario may take from the start of the run (60 unless named here).
    private static final Map<String, Integer> TIMEOUT_S = Map.of("compacted", 150, "encryption", 150);

    static {
        SCENARIOS.put("produce", Scenarios::produce);
        SCENARIOS.put("consume", Scenarios::consume);
        SCENARIOS.put("compacted", Scenarios::compacted);
        SCENARIOS.put("schema", Scenarios::schema);
        SCENARIOS.put("partitions", Scenarios::partitions);
        SCENARIOS.put("seek", Scenarios::seek);
        SCENARIOS.put("encryption", ClientFacts::encryption);
        SCENARIOS.put("dlqinitial", ClientFacts::dlqInitial);
        SCENARIOS.put("clientstats", ClientFacts::clientStats);
        SCENARIOS.put("reconnect", ClientFacts::reconnect);
        SCENARIOS.put("terminate", Termination::terminate);
        SCENARIOS.put("quotas", Termination::quotas);
        SCENARIOS.put("adminpartitions", AdminScenarios::partitions);
        SCENARIOS.put("adminmessages", AdminScenarios::messages);
        SCENARIOS.put("adminlookup", AdminScenarios::lookup);
        SCENARIOS.put("priority", DispatchScenarios::priority);
        SCENARIOS.put("activelistener", DispatchScenarios::activeListener);
        SCENARIOS.put("nackdelay", DispatchScenarios::nackDelay);
    }

    final PulsarClient client;
    final String httpUrl;
    final HttpClient http = HttpClient.newHttpClient();
    final String run = UUID.randomUUID().toString().substring(0, 8);

    private Scenarios(PulsarClient client, String httpUrl) {
        this.client = client;
        this.httpUrl = httpUrl;
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println("usage: Scenarios PULSAR_URL HTTP_URL OUT_JSON [SCENARIO...]");
            System.exit(2);
        }
        List<String> names = args.length > 3 ? List.of(args).subList(3, args.length) : List.copyOf(SCENARIOS.keySet());
        Path out = Path.of(args[2]);
        ObjectNode results = JSON.createObjectNode();
        PulsarClient client = PulsarClient.builder()
                .serviceUrl(args[0])
                .operationTimeout(15, TimeUnit.SECONDS)
                .build();
        ExecutorService pool = Executors.newCachedThreadPool(r -> {
            Thread t = new Thread(r, "scenario");
            t.setDaemon(true);
            return t;
        });
        Scenarios s = new Scenarios(client, args[1]);
        // The scenarios run side by side (each on topics of its own): the run takes as long as
        // the longest, and a scenario that hangs costs its own time limit only.
        long started = System.nanoTime();
        Map<String, ObjectNode> partial = new LinkedHashMap<>();
        Map<String, Future<?>> running = new LinkedHashMap<>();
        for (String name : names) {
            Scenario scenario = SCENARIOS.get(name);
            if (scenario == null) {
                results.putObject(name).put("error", "no scenario " + name + "; there are " + SCENARIOS.keySet());
                continue;
            }
            ObjectNode result = JSON.createObjectNode();
            partial.put(name, result);
            running.put(name, pool.submit(() -> {
                scenario.run(s, result);
                return null;
            }));
        }
        for (Map.Entry<String, Future<?>> e : running.entrySet()) {
            String name = e.getKey();
            int timeout = TIMEOUT_S.getOrDefault(name, 60);
            long left = started + TimeUnit.SECONDS.toNanos(timeout) - System.nanoTime();
            ObjectNode result = partial.get(name);
            try {
                e.getValue().get(Math.max(left, 0), TimeUnit.NANOSECONDS);
                results.set(name, result);
            } catch (TimeoutException t) {
                e.getValue().cancel(true); // its thread may still write to `result`: not reported
                results.putObject(name).put("error", "did not finish in " + timeout + " s");
            } catch (Exception t) {
                // What the scenario saw before it failed, and why it failed.
                result.put("error", stackTrace(t.getCause() != null ? t.getCause() : t));
                results.set(name, result);
            }
            write(out, results);
        }
        try {
            client.closeAsync().get(10, TimeUnit.SECONDS);
        } catch (Exception e) {
            System.err.println("closing the client: " + e);
        }
        write(out, results);
        System.exit(0);
    }

    // ------------------------------------------------------------------ scenarios

    /** Batched and unbatched producers, a consumer and a reader (with a seek) of what they sent. */
    private static void produce(Scenarios s, ObjectNode out) throws Exception {
        String unbatched = s.topic("unbatched");
        try (Producer<byte[]> p = s.client.newProducer().topic(unbatched).enableBatching(false).create()) {
            ArrayNode sent = out.putArray("unbatchedSent");
            for (int i = 0; i < 6; i++) {
                MessageId id = p.newMessage()
                        .key("k" + (i % 3))
                        .value(("u" + i).getBytes(StandardCharsets.UTF_8))
                        .property("n", String.valueOf(i))
                        .eventTime(1000 + i)
                        .send();
                sent.add(id(id));
            }
        }
        String batched = s.topic("batched");
        try (Producer<byte[]> p = s.batchedProducer(batched, 5)) {
            // Eight messages: a batch of five when the fifth is added, then three on the flush.
            List<CompletableFuture<MessageId>> pending = new ArrayList<>();
            for (int i = 0; i < 8; i++) {
                pending.add(p.newMessage()
                        .key("k" + (i % 3))
                        .value(("b" + i).getBytes(StandardCharsets.UTF_8))
                        .property("n", String.valueOf(i))
                        .eventTime(2000 + i)
                        .sendAsync());
            }
            p.flush();
            ArrayNode sent = out.putArray("batchedSent");
            for (CompletableFuture<MessageId> f : pending) {
                sent.add(id(f.get(30, TimeUnit.SECONDS)));
            }
        }
        out.put("unbatchedTopic", unbatched);
        out.put("batchedTopic", batched);
        for (String[] t : new String[][] {{unbatched, "unbatchedReceived", "6"}, {batched, "batchedReceived", "8"}}) {
            try (Consumer<byte[]> c = s.client.newConsumer()
                    .topic(t[0])
                    .subscriptionName("s")
                    .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                    .subscribe()) {
                ArrayNode got = out.putArray(t[1]);
                for (int i = 0; i < Integer.parseInt(t[2]); i++) {
                    Message<byte[]> m = s.receive(c);
                    got.add(describe(m));
                    c.acknowledge(m);
                }
            }
        }
        try (Reader<byte[]> r = s.client.newReader().topic(batched).startMessageId(MessageId.earliest).create()) {
            out.set("readerFirst", readAll(r));
            r.seek(MessageId.earliest);
            out.set("readerAfterSeek", readAll(r));
        }
    }

    /** A durable subscription: what was acknowledged is not delivered again, the rest is. */
    private static void consume(Scenarios s, ObjectNode out) throws Exception {
        String unbatched = s.topic("acks");
        ArrayNode sent = out.putArray("unbatchedSent");
        try (Producer<byte[]> p = s.client.newProducer().topic(unbatched).enableBatching(false).create()) {
            for (int i = 0; i < 8; i++) {
                sent.add(id(p.send(("a" + i).getBytes(StandardCharsets.UTF_8))));
            }
        }
        // The first consumer acknowledges all but the 4th and the 8th, one by one, and leaves.
        try (Consumer<byte[]> c = s.subscribe(unbatched, "s", false)) {
            ArrayNode got = out.putArray("firstReceived");
            for (int i = 0; i < 8; i++) {
                Message<byte[]> m = s.receive(c);
                got.add(id(m.getMessageId()));
                if (i != 3 && i != 7) {
                    c.acknowledge(m);
                }
            }
        }
        // The next consumer of the subscription gets those two, and nothing else.
        try (Consumer<byte[]> c = s.subscribe(unbatched, "s", false)) {
            ArrayNode got = out.putArray("redelivered");
            for (int i = 0; i < 2; i++) {
                Message<byte[]> m = s.receive(c);
                got.add(id(m.getMessageId()));
                c.acknowledge(m);
            }
            out.put("extra", describeOrNull(c.receive(QUIET_MS, TimeUnit.MILLISECONDS)));
        }
        out.put("unbatchedTopic", unbatched);

        // The same with batches (two of five) and batch-index acknowledgements.
        String batched = s.topic("batch-acks");
        ArrayNode bsent = out.putArray("batchedSent");
        try (Producer<byte[]> p = s.batchedProducer(batched, 5)) {
            List<CompletableFuture<MessageId>> pending = new ArrayList<>();
            for (int i = 0; i < 10; i++) {
                pending.add(p.sendAsync(("b" + i).getBytes(StandardCharsets.UTF_8)));
            }
            p.flush();
            for (CompletableFuture<MessageId> f : pending) {
                bsent.add(id(f.get(30, TimeUnit.SECONDS)));
            }
        }
        // All of the first batch and the first two of the second are acknowledged.
        try (Consumer<byte[]> c = s.subscribe(batched, "s", true)) {
            for (int i = 0; i < 10; i++) {
                Message<byte[]> m = s.receive(c);
                if (i < 7) {
                    c.acknowledge(m);
                }
            }
        }
        try (Consumer<byte[]> c = s.subscribe(batched, "s", true)) {
            ArrayNode got = out.putArray("batchRedelivered");
            for (int i = 0; i < 3; i++) {
                Message<byte[]> m = s.receive(c);
                got.add(describe(m));
                c.acknowledge(m);
            }
            out.put("batchExtra", describeOrNull(c.receive(QUIET_MS, TimeUnit.MILLISECONDS)));
        }
        out.put("batchedTopic", batched);
    }

    /**
     * Keyed messages (batched and not, a tombstone, a keyless one), a compaction over REST, one
     * message after it, then readers with and without readCompacted, and a readCompacted
     * consumer of a durable subscription.
     */
    private static void compacted(Scenarios s, ObjectNode out) throws Exception {
        String topic = s.topic("compacted");
        out.put("topic", topic);
        ArrayNode sent = out.putArray("sent");
        try (Producer<byte[]> single = s.client.newProducer().topic(topic).enableBatching(false).create();
                Producer<byte[]> batches = s.batchedProducer(topic, 3)) {
            for (String[] kv : new String[][] {{"k0", "a0"}, {"k1", "a1"}, {"k2", "a2"}, {"k3", "a3"}}) {
                sent.add(sentNode(kv[0], kv[1], single.newMessage().key(kv[0]).value(bytes(kv[1])).send()));
            }
            List<CompletableFuture<MessageId>> pending = new ArrayList<>();
            String[][] batch = {{"k0", "b0"}, {"k1", "b1"}, {"k4", "b4"}};
            for (String[] kv : batch) {
                pending.add(batches.newMessage().key(kv[0]).value(bytes(kv[1])).sendAsync());
            }
            batches.flush();
            for (int i = 0; i < batch.length; i++) {
                sent.add(sentNode(batch[i][0], batch[i][1], pending.get(i).get(30, TimeUnit.SECONDS)));
            }
            // An empty value deletes its key; a message without a key is not kept.
            sent.add(sentNode("k2", "", single.newMessage().key("k2").value(new byte[0]).send()));
            sent.add(sentNode(null, "nokey", single.newMessage().value(bytes("nokey")).send()));

            s.compact(topic);
            out.put("compacted", true);
            sent.add(sentNode("k1", "after", single.newMessage().key("k1").value(bytes("after")).send()));
        }
        try (Reader<byte[]> r = s.client.newReader()
                .topic(topic)
                .startMessageId(MessageId.earliest)
                .readCompacted(true)
                .create()) {
            out.set("compactedReader", readAll(r));
        }
        try (Reader<byte[]> r = s.client.newReader().topic(topic).startMessageId(MessageId.earliest).create()) {
            out.set("fullReader", readAll(r));
        }
        int expected = out.get("compactedReader").size();
        try (Consumer<byte[]> c = s.client.newConsumer()
                .topic(topic)
                .subscriptionName("compacted-sub")
                .subscriptionType(SubscriptionType.Exclusive)
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .readCompacted(true)
                .subscribe()) {
            ArrayNode got = out.putArray("compactedConsumer");
            for (int i = 0; i < expected; i++) {
                Message<byte[]> m = s.receive(c);
                got.add(describe(m));
                c.acknowledge(m);
            }
            out.put("compactedConsumerExtra", describeOrNull(c.receive(QUIET_MS, TimeUnit.MILLISECONDS)));
        }
    }

    /** A JSON value of the schema scenario. */
    public static final class Order {
        public String id;
        public int qty;

        public Order() {}

        Order(String id, int qty) {
            this.id = id;
            this.qty = qty;
        }
    }

    /** Producers and consumers with schemas: STRING (and raw bytes beside it), JSON, AUTO_CONSUME. */
    private static void schema(Scenarios s, ObjectNode out) throws Exception {
        String strings = s.topic("strings");
        out.put("stringTopic", strings);
        try (Producer<String> p = s.client.newProducer(Schema.STRING).topic(strings).enableBatching(false).create()) {
            p.send("s0");
            p.send("s1");
            // A message of another schema (raw bytes) from the same producer: registered first.
            p.newMessage(Schema.BYTES).value(bytes("raw")).send();
        }
        try (Consumer<String> c = s.client.newConsumer(Schema.STRING)
                .topic(strings)
                .subscriptionName("s")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .subscribe()) {
            ArrayNode got = out.putArray("strings");
            for (int i = 0; i < 3; i++) {
                Message<String> m = c.receive((int) RECEIVE.toMillis(), TimeUnit.MILLISECONDS);
                if (m == null) {
                    throw new AssertionError("no message " + i + " of " + strings);
                }
                ObjectNode n = got.addObject();
                n.put("value", m.getValue());
                n.put("schemaVersion", hex(m.getSchemaVersion()));
                c.acknowledge(m);
            }
        }

        String orders = s.topic("orders");
        out.put("jsonTopic", orders);
        Schema<Order> schema = Schema.JSON(Order.class);
        try (Producer<Order> p = s.client.newProducer(schema).topic(orders).enableBatching(false).create()) {
            p.newMessage().key("o1").value(new Order("o1", 3)).send();
            p.newMessage().key("o2").value(new Order("o2", 5)).send();
        }
        try (Consumer<Order> c = s.client.newConsumer(schema)
                .topic(orders)
                .subscriptionName("typed")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .subscribe()) {
            ArrayNode got = out.putArray("orders");
            for (int i = 0; i < 2; i++) {
                Message<Order> m = c.receive((int) RECEIVE.toMillis(), TimeUnit.MILLISECONDS);
                if (m == null) {
                    throw new AssertionError("no order " + i);
                }
                ObjectNode n = got.addObject();
                n.put("key", m.getKey());
                n.put("id", m.getValue().id);
                n.put("qty", m.getValue().qty);
                n.put("schemaVersion", hex(m.getSchemaVersion()));
                c.acknowledge(m);
            }
        }
        // A consumer that takes whatever schema the topic has (asks the service for it).
        try (Consumer<GenericRecord> c = s.client.newConsumer(Schema.AUTO_CONSUME())
                .topic(orders)
                .subscriptionName("auto")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .subscribe()) {
            ArrayNode got = out.putArray("autoConsumed");
            for (int i = 0; i < 2; i++) {
                Message<GenericRecord> m = c.receive((int) RECEIVE.toMillis(), TimeUnit.MILLISECONDS);
                if (m == null) {
                    throw new AssertionError("no auto-consumed order " + i);
                }
                ObjectNode n = got.addObject();
                n.put("schemaType", m.getValue().getSchemaType().toString());
                n.put("id", String.valueOf(m.getValue().getField("id")));
                n.put("qty", ((Number) m.getValue().getField("qty")).intValue());
                c.acknowledge(m);
            }
        }
    }

    /**
     * Seeks: six unbatched messages with a time mark between the third and the fourth (their
     * publish times lie on either side of it), a durable consumer that receives them all and
     * acknowledges them, seeks back to the second by id and by the mark, and receives from
     * there again (the Java client drops the message sought to itself unless the consumer is
     * startMessageIdInclusive: a second consumer is); a reader that seeks by id, by the mark,
     * to a message's exact publish time, to the latest (then reads only a message sent after it)
     * and to the earliest. Then a
     * consumer and a reader that seek to members of batches.
     */
    private static void seek(Scenarios s, ObjectNode out) throws Exception {
        String topic = s.topic("seek");
        out.put("topic", topic);
        ArrayNode sent = out.putArray("sent");
        List<MessageId> ids = new ArrayList<>();
        long mark;
        try (Producer<byte[]> p = s.client.newProducer().topic(topic).enableBatching(false).create()) {
            for (int i = 0; i < 3; i++) {
                ids.add(p.send(bytes("v" + i)));
            }
            // Publish times are the producer's clock in milliseconds: well apart from the mark.
            Thread.sleep(200);
            mark = System.currentTimeMillis();
            Thread.sleep(200);
            for (int i = 3; i < 6; i++) {
                ids.add(p.send(bytes("v" + i)));
                Thread.sleep(5); // each its own millisecond: a seek to one's publish time names it
            }
        }
        ids.forEach(i -> sent.add(id(i)));
        out.put("mark", mark);
        List<Long> published = new ArrayList<>();
        try (Consumer<byte[]> c = s.subscribe(topic, "s", false)) {
            ArrayNode got = out.putArray("consumerFirst");
            for (int i = 0; i < 6; i++) {
                Message<byte[]> m = s.receive(c);
                published.add(m.getPublishTime());
                got.add(describe(m).put("publishTime", m.getPublishTime()));
                c.acknowledge(m);
            }
            c.seek(ids.get(1));
            receiveAll(s, c, 4, out.putArray("consumerAfterSeekId"));
            c.seek(mark);
            receiveAll(s, c, 3, out.putArray("consumerAfterSeekTime"));
        }
        // With startMessageIdInclusive the client keeps the message sought to.
        try (Consumer<byte[]> c = s.client.newConsumer()
                .topic(topic)
                .subscriptionName("inclusive")
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .startMessageIdInclusive()
                .subscribe()) {
            receiveAll(s, c, 6, out.putArray("inclusiveFirst"));
            c.seek(ids.get(1));
            receiveAll(s, c, 5, out.putArray("inclusiveAfterSeekId"));
        }
        try (Reader<byte[]> r = s.client.newReader().topic(topic).startMessageId(MessageId.earliest).create()) {
            out.set("readerFirst", readAll(r));
            r.seek(ids.get(2));
            out.set("readerAfterSeekId", readAll(r));
            r.seek(mark);
            out.set("readerAfterSeekTime", readAll(r));
            // Exactly a message's publish time: that message is the first read (Pulsar's broker
            // resets to the first message not published before the time).
            r.seek(published.get(4));
            out.set("readerAfterSeekExactTime", readAll(r));
            r.seek(MessageId.latest);
            out.set("readerAfterSeekLatest", readAll(r));
            try (Producer<byte[]> p = s.client.newProducer().topic(topic).enableBatching(false).create()) {
                sent.add(id(p.send(bytes("v6"))));
            }
            Message<byte[]> next = r.readNext((int) RECEIVE.toMillis(), TimeUnit.MILLISECONDS);
            out.put("readerAfterLatestNext", describeOrNull(next));
            r.seek(MessageId.earliest);
            out.set("readerAfterSeekEarliest", readAll(r));
        }

        // A seek to a member of a batch: a batch of five and one of three.
        String batched = s.topic("seek-batched");
        out.put("batchedTopic", batched);
        List<MessageId> bids = new ArrayList<>();
        try (Producer<byte[]> p = s.batchedProducer(batched, 5)) {
            List<CompletableFuture<MessageId>> pending = new ArrayList<>();
            for (int i = 0; i < 8; i++) {
                pending.add(p.sendAsync(bytes("b" + i)));
            }
            p.flush();
            for (CompletableFuture<MessageId> f : pending) {
                bids.add(f.get(30, TimeUnit.SECONDS));
            }
        }
        ArrayNode bsent = out.putArray("batchedSent");
        bids.forEach(i -> bsent.add(id(i)));
        try (Consumer<byte[]> c = s.subscribe(batched, "s", false)) {
            receiveAll(s, c, 8, out.putArray("batchedConsumerFirst"));
            c.seek(bids.get(2));
            receiveAll(s, c, 5, out.putArray("batchedConsumerAfterSeekId"));
        }
        try (Reader<byte[]> r = s.client.newReader().topic(batched).startMessageId(MessageId.earliest).create()) {
            out.set("batchedReaderFirst", readAll(r));
            r.seek(bids.get(6));
            out.set("batchedReaderAfterSeekId", readAll(r));
        }
    }

    /** Into `got`: `n` messages, each acknowledged, and any that arrives within QUIET_MS after them. */
    private static void receiveAll(Scenarios s, Consumer<byte[]> c, int n, ArrayNode got) throws Exception {
        for (int i = 0; i < n; i++) {
            Message<byte[]> m = s.receive(c);
            got.add(describe(m));
            c.acknowledge(m);
        }
        ObjectNode extra = describeOrNull(c.receive(QUIET_MS, TimeUnit.MILLISECONDS));
        if (extra != null) {
            got.add(extra);
        }
    }

    // ------------------------------------------------------------------ helpers

    /**
     * A partitioned topic of five partitions (created over REST): a producer whose router sends
     * "hello-" messages to partition 10 % 5 = 0 and the others to 11 % 5 = 1, a consumer of the
     * topic, and a reader of partition 1 that reads to its end (the last message id names the
     * partition), seeks back and reads it again. Each id is recorded with its partition.
     */
    private static void partitions(Scenarios s, ObjectNode out) throws Exception {
        String topic = s.topic("partitions");
        String path = topic.replace("persistent://", "/admin/v2/persistent/") + "/partitions";
        HttpResponse<String> put = s.http.send(
                HttpRequest.newBuilder(URI.create(s.httpUrl + path))
                        // HTTP/1.1: the client's default asks to upgrade to h2c, and a body sent
                        // with that request does not reach the service.
                        .version(HttpClient.Version.HTTP_1_1)
                        .header("Content-Type", "application/json")
                        .PUT(HttpRequest.BodyPublishers.ofString("5"))
                        .build(),
                HttpResponse.BodyHandlers.ofString());
        if (put.statusCode() != 204) {
            throw new AssertionError("PUT " + path + ": " + put.statusCode() + " " + put.body());
        }
        out.put("topic", topic);
        MessageRouter router = new MessageRouter() {
            @Override
            public int choosePartition(Message<?> msg, TopicMetadata metadata) {
                boolean hello = new String(msg.getData(), StandardCharsets.UTF_8).startsWith("hello-");
                return (hello ? 10 : 11) % metadata.numPartitions();
            }
        };
        ObjectNode sent = out.putObject("sent");
        try (Producer<byte[]> p = s.client.newProducer()
                .topic(topic)
                .enableBatching(false)
                .messageRoutingMode(MessageRoutingMode.CustomPartition)
                .messageRouter(router)
                .create()) {
            for (String v : new String[] {"hello-0", "hello-1", "world-0", "world-1"}) {
                sent.set(v, located(p.send(bytes(v)), null));
            }
        }
        try (Consumer<byte[]> c = s.subscribe(topic, "s", false)) {
            ObjectNode got = out.putObject("received");
            for (int i = 0; i < 4; i++) {
                Message<byte[]> m = s.receive(c);
                got.set(new String(m.getValue(), StandardCharsets.UTF_8), located(m.getMessageId(), m.getTopicName()));
                c.acknowledge(m);
            }
        }
        try (Reader<byte[]> r = s.client.newReader()
                .topic(topic + "-partition-1")
                .startMessageId(MessageId.earliest)
                .create()) {
            out.set("readerFirst", readLocated(r));
            r.seek(MessageId.earliest);
            out.set("readerAfterSeek", readLocated(r));
        }
    }

    /** An id with its partition (and the topic a message came from, when there is one). */
    private static ObjectNode located(MessageId id, String topic) {
        ObjectNode n = JSON.createObjectNode();
        n.put("id", id(id));
        n.put("partition", ((MessageIdAdv) id).getPartitionIndex());
        if (topic != null) {
            n.put("topic", topic);
        }
        return n;
    }

    /** Every message from the reader's position to its end: value, id and partition. */
    private static ArrayNode readLocated(Reader<byte[]> r) throws Exception {
        ArrayNode got = JSON.createArrayNode();
        while (r.hasMessageAvailable()) {
            Message<byte[]> m = r.readNext((int) RECEIVE.toMillis(), TimeUnit.MILLISECONDS);
            if (m == null) {
                throw new AssertionError("hasMessageAvailable, but no message in " + RECEIVE);
            }
            got.add(located(m.getMessageId(), null).put("value", new String(m.getValue(), StandardCharsets.UTF_8)));
        }
        return got;
    }

    String topic(String what) {
        return "persistent://public/default/java-" + what + "-" + run;
    }

    Producer<byte[]> batchedProducer(String topic, int size) throws Exception {
        // Batches of `size`, and no publish delay that could cut one short: a flush sends the rest.
        return client.newProducer()
                .topic(topic)
                .enableBatching(true)
                .batchingMaxMessages(size)
                .batchingMaxPublishDelay(1, TimeUnit.HOURS)
                .create();
    }

    Consumer<byte[]> subscribe(String topic, String subscription, boolean batchIndexAcks) throws Exception {
        return client.newConsumer()
                .topic(topic)
                .subscriptionName(subscription)
                .subscriptionType(SubscriptionType.Exclusive)
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .enableBatchIndexAcknowledgment(batchIndexAcks)
                .subscribe();
    }

    <T> Message<T> receive(Consumer<T> c) throws Exception {
        Message<T> m = c.receive((int) RECEIVE.toMillis(), TimeUnit.MILLISECONDS);
        if (m == null) {
            throw new AssertionError("no message in " + RECEIVE + " on " + c.getTopic());
        }
        return m;
    }

    /** Every message from the reader's position to the end of the topic. */
    static ArrayNode readAll(Reader<byte[]> r) throws Exception {
        ArrayNode got = JSON.createArrayNode();
        while (r.hasMessageAvailable()) {
            Message<byte[]> m = r.readNext((int) RECEIVE.toMillis(), TimeUnit.MILLISECONDS);
            if (m == null) {
                throw new AssertionError("hasMessageAvailable, but no message in " + RECEIVE);
            }
            got.add(describe(m));
        }
        return got;
    }

    /** PUT .../compaction, then GET .../compaction until the run is over; it must succeed. */
    void compact(String topic) throws Exception {
        String path = topic.replace("persistent://", "/admin/v2/persistent/") + "/compaction";
        HttpResponse<String> put = http.send(
                HttpRequest.newBuilder(URI.create(httpUrl + path)).PUT(HttpRequest.BodyPublishers.noBody()).build(),
                HttpResponse.BodyHandlers.ofString());
        if (put.statusCode() != 204) {
            throw new AssertionError("PUT " + path + ": " + put.statusCode() + " " + put.body());
        }
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(140);
        while (true) {
            HttpResponse<String> get = http.send(
                    HttpRequest.newBuilder(URI.create(httpUrl + path)).GET().build(),
                    HttpResponse.BodyHandlers.ofString());
            JsonNode status = JSON.readTree(get.body());
            String state = status.path("status").asText();
            if (state.equals("SUCCESS")) {
                return;
            }
            if (state.equals("ERROR") || System.nanoTime() > deadline) {
                throw new AssertionError("compaction of " + topic + ": " + get.body());
            }
            Thread.sleep(100);
        }
    }

    static String id(MessageId id) {
        MessageIdAdv a = (MessageIdAdv) id;
        return a.getLedgerId() + ":" + a.getEntryId() + ":" + a.getBatchIndex();
    }

    static ObjectNode describe(Message<byte[]> m) {
        ObjectNode n = JSON.createObjectNode();
        n.put("id", id(m.getMessageId()));
        n.put("key", m.hasKey() ? m.getKey() : null);
        n.put("value", Base64.getEncoder().encodeToString(m.getValue()));
        ObjectNode props = n.putObject("properties");
        m.getProperties().forEach(props::put);
        n.put("eventTime", m.getEventTime());
        return n;
    }

    static ObjectNode describeOrNull(Message<byte[]> m) {
        return m == null ? null : describe(m);
    }

    static ObjectNode sentNode(String key, String value, MessageId id) {
        ObjectNode n = JSON.createObjectNode();
        n.put("id", id(id));
        n.put("key", key);
        n.put("value", Base64.getEncoder().encodeToString(bytes(value)));
        return n;
    }

    static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    private static String hex(byte[] b) {
        return b == null ? null : HexFormat.of().formatHex(b);
    }

    private static String stackTrace(Throwable t) {
        StringWriter w = new StringWriter();
        t.printStackTrace(new PrintWriter(w));
        return w.toString();
    }

    private static void write(Path out, ObjectNode results) throws Exception {
        Path tmp = out.resolveSibling(out.getFileName() + ".tmp");
        Files.writeString(tmp, JSON.writerWithDefaultPrettyPrinter().writeValueAsString(results));
        Files.move(tmp, out, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
    }
}
