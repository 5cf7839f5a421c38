package compactor.e2e;

import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.ConsumerEventListener;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;

/**
 * Scenarios of which consumer gets what (issue 51): a Shared subscription's priority levels, a
 * Failover subscription's active consumer as the ConsumerEventListener hears it, and negative
 * acknowledgements redelivered after the client's delay. Registered in {@link Scenarios}.
 */
final class DispatchScenarios {

    private DispatchScenarios() {}

    /**
     * A Shared subscription with a consumer of priority level 0 whose queue holds 5 messages and
     * one of level 1: of 20 messages the first takes what its permits allow, the second the rest.
     * Then the client's refusal of a negative level.
     */
    static void priority(Scenarios s, ObjectNode out) throws Exception {
        String topic = s.topic("priority");
        out.put("topic", topic);
        try (Consumer<byte[]> high = shared(s, topic, 0, 5);
                Consumer<byte[]> low = shared(s, topic, 1, 1000);
                Producer<byte[]> p = s.client.newProducer().topic(topic).enableBatching(false).create()) {
            for (int i = 0; i < 20; i++) {
                p.send(("m" + i).getBytes(StandardCharsets.UTF_8));
            }
            // The low level first: the high level's client holds 5 unreceived, with no permits left.
            out.put("low", drain(low));
            out.put("high", drain(high));
        }
        try {
            s.client.newConsumer().topic(topic).subscriptionName("negative").priorityLevel(-1).subscribe().close();
            out.put("negative", "accepted");
        } catch (IllegalArgumentException e) {
            out.put("negative", "refused by the client: " + e.getMessage());
        }
    }

    private static Consumer<byte[]> shared(Scenarios s, String topic, int level, int queue) throws Exception {
        return s.client.newConsumer()
                .topic(topic)
                .subscriptionName("levels")
                .subscriptionType(SubscriptionType.Shared)
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .priorityLevel(level)
                .receiverQueueSize(queue)
                .subscribe();
    }

    /** How many messages arrive (each acknowledged) until none comes for a second. */
    private static int drain(Consumer<byte[]> c) throws Exception {
        int n = 0;
        for (Message<byte[]> m; (m = c.receive(1000, TimeUnit.MILLISECONDS)) != null; n++) {
            c.acknowledge(m);
        }
        return n;
    }

    /** What a consumer's event listener hears, in order: "active" or "inactive". */
    static final class Heard implements ConsumerEventListener {
        final List<String> events = Collections.synchronizedList(new ArrayList<>());

        @Override
        public void becameActive(Consumer<?> consumer, int partitionId) {
            events.add("active");
        }

        @Override
        public void becameInactive(Consumer<?> consumer, int partitionId) {
            events.add("inactive");
        }

        ArrayNode json() {
            ArrayNode a = Scenarios.JSON.createArrayNode();
            synchronized (events) {
                events.forEach(a::add);
            }
            return a;
        }
    }

    /**
     * Failover: "standby" (level 1) subscribes, then "primary" (level 0) takes over; the primary
     * closes and the standby is active again. What each listener heard after each step.
     */
    static void activeListener(Scenarios s, ObjectNode out) throws Exception {
        String topic = s.topic("active-listener");
        out.put("topic", topic);
        Heard standbyHeard = new Heard();
        Heard primaryHeard = new Heard();
        try (Consumer<byte[]> standby = failover(s, topic, "standby", 1, standbyHeard)) {
            Thread.sleep(1000);
            out.set("standbyAlone", standbyHeard.json());
            Consumer<byte[]> primary = failover(s, topic, "primary", 0, primaryHeard);
            Thread.sleep(1000);
            out.set("standbyBeside", standbyHeard.json());
            out.set("primary", primaryHeard.json());
            primary.close();
            Thread.sleep(1000);
            out.set("standbyAfter", standbyHeard.json());
        }
    }

    private static Consumer<byte[]> failover(Scenarios s, String topic, String name, int level, Heard heard)
            throws Exception {
        return s.client.newConsumer()
                .topic(topic)
                .subscriptionName("listened")
                .subscriptionType(SubscriptionType.Failover)
                .consumerName(name)
                .priorityLevel(level)
                .consumerEventListener(heard)
                .subscribe();
    }

    /** A Shared consumer with a 100 ms negative-ack delay: milliseconds from each nack to its redelivery. */
    static void nackDelay(Scenarios s, ObjectNode out) throws Exception {
        String topic = s.topic("nack-delay");
        out.put("topic", topic);
        ArrayNode delays = out.putArray("delaysMs");
        try (Consumer<byte[]> c = s.client.newConsumer()
                        .topic(topic)
                        .subscriptionName("nacked")
                        .subscriptionType(SubscriptionType.Shared)
                        .negativeAckRedeliveryDelay(100, TimeUnit.MILLISECONDS)
                        .subscribe();
                Producer<byte[]> p = s.client.newProducer().topic(topic).enableBatching(false).create()) {
            for (int i = 0; i < 5; i++) {
                p.send(("m" + i).getBytes(StandardCharsets.UTF_8));
                Message<byte[]> m = s.receive(c);
                long nacked = System.nanoTime();
                c.negativeAcknowledge(m);
                Message<byte[]> again = s.receive(c);
                if (!again.getMessageId().equals(m.getMessageId()) || again.getRedeliveryCount() != 1) {
                    throw new AssertionError("after a nack of " + m.getMessageId() + ": " + again.getMessageId());
                }
                delays.add(TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - nacked));
                c.acknowledge(again);
            }
        }
    }
}
