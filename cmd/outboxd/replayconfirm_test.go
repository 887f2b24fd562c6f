package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
	"github.com/outboxd/outboxd/relay"
)

// replay asks before changing more than 10 rows, showing what it would do, and the run
// must change what the operator was shown. It took again every row the plan had looked
// at, deciding each anew: a row the plan left alone (pending, or in flight) that a relay
// delivered while the operator read the prompt was put back too (--redeliver), so a
// receiver that does not enforce the key acted twice on a row the confirmed plan said
// was left as it was, and more rows were replayed than were confirmed.
func TestReplayChangesOnlyWhatWasConfirmed(t *testing.T) {
	t.Parallel()
	rcv, err := receiver.Start(receiver.Options{IgnoreKeys: true}) // forwarded: acts on every request
	require.NoError(t, err)
	t.Cleanup(rcv.Close)
	d := newOpsDB(t, "OUTBOX_WEBHOOK_URL="+rcv.URL())
	for i := range 11 {
		d.insert(t, fixture{Key: fmt.Sprintf("sent-%02d", i), Status: outbox.StatusDelivered, Attempts: 1, Age: 30 * time.Minute})
	}
	d.insert(t, fixture{Key: "fresh", Status: outbox.StatusPending, Age: time.Minute})

	deliverAll := func() {
		t.Helper()
		hook, err := webhook.New(webhook.Config{URL: rcv.URL(), Guarantee: connectors.Forwarded, Timeout: 5 * time.Second})
		require.NoError(t, err)
		r, err := relay.New(d.pool, &relay.Config{PollInterval: 20 * time.Millisecond, ShutdownTimeout: 5 * time.Second},
			map[string]relay.Instance{"webhook": {Connector: hook}})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		require.Eventually(t, func() bool {
			return d.count(t, `SELECT count(*) FROM outbox WHERE status <> 'delivered'`) == 0
		}, time.Minute, 20*time.Millisecond)
		cancel()
		require.NoError(t, <-done)
	}

	tty, answer := openTerminal(t)
	prompt := &untilWriter{until: "[y/N]", seen: make(chan struct{})}
	var out bytes.Buffer
	code := make(chan int, 1)
	go func() {
		code <- run(t.Context(), []string{"replay", "--connector", "webhook", "--newer-than", "1h", "--redeliver",
			"--reason", "resend the last hour"}, d.environ, tty, &out, prompt)
	}()
	select {
	case <-prompt.seen:
	case c := <-code:
		t.Fatalf("replay exited %d without asking: %s", c, prompt.String())
	case <-time.After(time.Minute):
		t.Fatal("replay did not ask")
	}
	require.Contains(t, prompt.String(), "Replay 11 rows? [y/N]")

	// While the operator reads the prompt, a relay delivers the row the plan left alone.
	deliverAll()
	require.Equal(t, 1, rcv.Effects("fresh"))

	_, err = answer.WriteString("y\n")
	require.NoError(t, err)
	select {
	case c := <-code:
		require.Equal(t, exitOK, c, prompt.String())
	case <-time.After(time.Minute):
		t.Fatal("replay did not finish")
	}
	require.Contains(t, out.String(), "replayed: 11\n", out.String())
	require.Contains(t, out.String(), "unchanged: 1\n  fresh (already pending)\n", out.String())
	require.Equal(t, outbox.StatusDelivered, d.status(t, "fresh"), "not confirmed, and delivered once since")

	deliverAll()
	require.Equal(t, 1, rcv.Effects("fresh"), "the receiver acted twice")
	require.Equal(t, 1, rcv.Effects("sent-00"), "redelivered as confirmed")
}

// untilWriter collects a command's output, safe for concurrent use, and closes seen once
// it holds until (at its first write when until is empty).
type untilWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	until string
	seen  chan struct{}
	once  sync.Once
}

func (w *untilWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.until) {
		w.once.Do(func() { close(w.seen) })
	}
	return n, err
}

func (w *untilWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// openTerminal opens a pseudo-terminal, so that a command's stdin is a terminal that
// asks: tty is the command's end, and what the test writes to answer reaches it as
// typed lines.
func openTerminal(t *testing.T) (tty, answer *os.File) {
	t.Helper()
	answer, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = answer.Close() })
	var unlock int32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, answer.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); errno != 0 {
		t.Fatalf("unlock the pseudo-terminal: %v", errno)
	}
	var n uint32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, answer.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); errno != 0 {
		t.Fatalf("name the pseudo-terminal: %v", errno)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tty.Close() })
	require.True(t, isTerminal(tty))
	return tty, answer
}
