// Command goclient drives Pulsar's official Go client (github.com/apache/pulsar-client-go)
// against a running service, as an application would, and records what it saw as JSON; the
// Python tests (tests/e2e/test_go_client.py) judge it. It is the Go twin of tests/java.
//
// Usage: goclient PULSAR_URL HTTP_URL OUT_JSON [SCENARIO...] (all scenarios when none is named).
// The scenarios run side by side, each on topics of its own; OUT_JSON is rewritten as each one
// ends: {"name": {...}}, with "error" set in a scenario that failed or overran its time (what
// it saw until then is kept beside it). The client's warnings and errors go to stderr.
package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	pulsarlog "github.com/apache/pulsar-client-go/pulsar/log"
)

// A scenario records what it sees in out as it goes, so that a failure keeps the evidence.
type scenario func(s *session, out *result) error

var scenarios = map[string]scenario{
	"produce":         produce,
	"shared":          shared,
	"keyshared":       keyShared,
	"failover":        failover,
	"redelivery":      redelivery,
	"reader":          reader,
	"compacted":       compacted,
	"seek":            seek,
	"schema":          schemas,
	"partitions":      partitions,
	"lastid":          lastID,
	"http":            httpURL,
	"compression":     compression,
	"encryption":      encryption,
	"dlqinitial":      dlqInitial,
	"clientstats":     clientStats,
	"terminate":       terminate,
	"quotas":          backlogQuota,
	"adminpartitions": adminPartitions,
	"adminmessages":   adminMessages,
	"adminlookup":     adminLookup,
	"listener":        activeListener,
	"reseek":          reseek,
	"nackdelay":       nackDelay,
}

// Seconds a scenario may take from the start of the run (60 unless named here): the compaction
// waits for a Spark job.
var timeouts = map[string]time.Duration{
	"compacted": 150 * time.Second, "compression": 150 * time.Second, "encryption": 150 * time.Second,
}

// A result is a scenario's JSON object, safe to write from its goroutine while main reads it.
type result struct {
	mu     sync.Mutex
	fields map[string]any
}

func (r *result) set(name string, v any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fields[name] = v
}

func (r *result) snapshot() map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	copied := make(map[string]any, len(r.fields))
	for k, v := range r.fields {
		copied[k] = v
	}
	return copied
}

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: goclient PULSAR_URL HTTP_URL OUT_JSON [SCENARIO...]")
		os.Exit(2)
	}
	pulsarURL, httpURL, outPath := os.Args[1], os.Args[2], os.Args[3]
	names := os.Args[4:]
	if len(names) == 0 {
		for name := range scenarios {
			names = append(names, name)
		}
		sort.Strings(names)
	}
	s, err := newSession(pulsarURL, httpURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "creating the client:", err)
		os.Exit(1)
	}
	results := map[string]any{}
	started := time.Now()
	type done struct {
		name string
		err  error
	}
	finished := make(chan done, len(names))
	running := map[string]*result{}
	for _, name := range names {
		run, ok := scenarios[name]
		if !ok {
			results[name] = map[string]any{"error": fmt.Sprintf("no scenario %q", name)}
			continue
		}
		out := &result{fields: map[string]any{}}
		running[name] = out
		go func(name string) {
			defer func() {
				if p := recover(); p != nil {
					finished <- done{name, fmt.Errorf("panic: %v", p)}
				}
			}()
			finished <- done{name, run(s, out)}
		}(name)
	}
	// One deadline per scenario, from the start: a scenario that hangs costs its own limit only.
	pending := len(running)
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for pending > 0 {
		select {
		case d := <-finished:
			if _, waiting := running[d.name]; !waiting {
				continue // reported as overrun already
			}
			fields := running[d.name].snapshot()
			if d.err != nil {
				fields["error"] = d.err.Error()
			}
			results[d.name] = fields
			delete(running, d.name)
			pending--
		case <-ticker.C:
			for name, out := range running {
				limit, ok := timeouts[name]
				if !ok {
					limit = 60 * time.Second
				}
				if time.Since(started) > limit {
					fields := out.snapshot()
					fields["error"] = fmt.Sprintf("did not finish in %s", limit)
					results[name] = fields
					delete(running, name)
					pending--
				}
			}
		}
		write(outPath, results)
	}
	write(outPath, results)
	closed := make(chan struct{})
	go func() {
		s.client.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		fmt.Fprintln(os.Stderr, "closing the client took more than 10 s")
	}
}

// newClient is the client every scenario uses (and redelivery's second one): warnings and
// errors only, to stderr, where the Python side reads them when a scenario fails.
func newClient(url string) (pulsar.Client, error) {
	handler := slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})
	return pulsar.NewClient(pulsar.ClientOptions{
		URL:              url,
		OperationTimeout: 15 * time.Second,
		Logger:           pulsarlog.NewLoggerWithSlog(slog.New(handler)),
	})
}

func write(path string, results map[string]any) {
	data, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		fmt.Fprintln(os.Stderr, "encoding the results:", err)
		return
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "writing the results:", err)
		return
	}
	if err := os.Rename(tmp, path); err != nil {
		fmt.Fprintln(os.Stderr, "writing the results:", err)
	}
}
