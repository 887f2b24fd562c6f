package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/mail"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/internal/slacktest"
	"github.com/outboxd/outboxd/internal/stripemocktest"
	"github.com/outboxd/outboxd/outbox"
)

// crashKills is how many times TestServeSurvivesRepeatedKills kills `outboxd serve`.
const crashKills = 8

// crashRelays is how many `outboxd serve` processes run at once.
const crashRelays = 2

// crashSeedEnv, when set, seeds TestServeSurvivesRepeatedKills (rows and kill moments)
// to repeat a run whose seed it logged. Not OUTBOX_: serve would warn about it.
const crashSeedEnv = "OUTBOXD_TEST_CRASH_SEED"

// TestServeSurvivesRepeatedKills runs crashRelays `outboxd serve` processes with every
// connector kind, each against a real loopback receiver: the HTTP receiver that enforces
// keys (webhook), one that does not (webhook:crm, forwarded, policy hold), stripe-mock
// behind a recording proxy (payment), an SMTP server (email, forwarded, policy hold) and
// the fake Slack Web API (slack). It kills them crashKills times, in turn, from inside a
// receiver, just after it performed an effect and before it answered: the failure that
// matters most. The moments are a seeded number of effects, not times; every third kill
// is preceded by a SIGTERM, so that it strikes the drain. Each process runs with a short
// lease, so the dead one's rows are reclaimed as ambiguous by the other, or by its
// successor. Rows arrive in waves, by outbox.Enqueue and through the intent API of
// whichever process answers, half of them under ordering keys that mix instances.
//
// At the end every row is finished as its connector's guarantee says: enforced
// (webhook, payment) and reconciled (slack) rows are delivered, and forwarded ones are
// delivered or held after an ambiguous attempt; no row is left pending or leased but
// those behind a held row of their ordering key. Each key had one effect at the
// receivers that enforce or reconcile it, forwarded keys at most one, and every payment
// request carried its row's key with the same body (stripe-mock does not dedupe). Per
// ordering key, every effect of a row came before any of the next row's. The attempts
// log agrees with the rows, and no receiver saw more requests for a row than it counted
// attempts. Then an operator replays the held rows (outboxd replay --status held) while
// the processes run: each is sent again, the rows behind it go, every row ends
// delivered, and the order per key still holds.
func TestServeSurvivesRepeatedKills(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(crashSeedEnv); v != "" {
		var err error
		seed, err = strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, crashSeedEnv)
	}
	t.Logf("seed %d (%s=%[1]d repeats the run)", seed, crashSeedEnv)
	rng := rand.New(rand.NewPCG(seed, seed>>1))

	var (
		effects = &crashEffects{byKey: map[string][]int{}}
		secret  = "whsec_" + base64.StdEncoding.EncodeToString([]byte("crash-test-signing-secret-0123456"))
	)
	hook, err := receiver.Start(receiver.Options{Secret: secret, OnEffect: func(e receiver.Effect) { effects.observe(e.Key) }})
	require.NoError(t, err)
	t.Cleanup(hook.Close)
	// webhook:crm's receiver does not dedupe: the instance is forwarded, with the hold
	// policy.
	crm, err := receiver.Start(receiver.Options{IgnoreKeys: true, OnEffect: func(e receiver.Effect) { effects.observe(e.Key) }})
	require.NoError(t, err)
	t.Cleanup(crm.Close)
	slackFake := slacktest.Start(t, slacktest.Options{OnPostFunc: effects.observe})
	smtpAddr, mails := startCrashSMTP(t, effects.observe)
	stripeBase, payments := startStripeProxy(t, stripemocktest.Start(t), effects.observe)

	dsn := pgtest.URL(t)
	pool, err := pgxpool.New(t.Context(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	token, hash, err := intent.NewToken()
	require.NoError(t, err)
	environ := make([]string, 0, len(os.Environ())+32)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_") && !strings.HasPrefix(kv, "GOGC=") && !strings.HasPrefix(kv, "GOMEMLIMIT=") {
			environ = append(environ, kv)
		}
	}
	environ = append(environ,
		serveChildEnv+"=1",
		"OUTBOX_DATABASE_URL="+dsn,
		"OUTBOX_HTTP_ADDR=127.0.0.1:0",
		"OUTBOX_LOG_FORMAT=json",
		`OUTBOX_API_TOKENS=[{"name":"agent","sha256":"`+hash+`","connectors":["webhook","webhook:crm","payment","email","slack"]}]`,
		"OUTBOX_API_RATE=0",
		// A short lease, so that the rows of a killed process come back within the test;
		// each time limit is 1s shorter, as serve requires.
		"OUTBOX_LEASE=3s",
		"OUTBOX_POLL_INTERVAL=50ms",
		"OUTBOX_BACKOFF_BASE=50ms",
		"OUTBOX_BACKOFF_MAX=500ms",
		"OUTBOX_CONCURRENCY=16",
		"OUTBOX_SHUTDOWN_TIMEOUT=10s",
		"OUTBOX_WEBHOOK_URL="+hook.URL(),
		"OUTBOX_WEBHOOK_SECRET="+secret,
		"OUTBOX_WEBHOOK_GUARANTEE=enforced",
		"OUTBOX_WEBHOOK_TIMEOUT=2s",
		"OUTBOX_CONNECTORS=webhook:crm",
		"OUTBOX_WEBHOOK_CRM_URL="+crm.URL(),
		"OUTBOX_WEBHOOK_CRM_TIMEOUT=2s",
		"OUTBOX_WEBHOOK_CRM_ON_AMBIGUOUS=hold",
		"OUTBOX_WEBHOOK_CRM_CONCURRENCY=4",
		"OUTBOX_PAYMENT_API_KEY=sk_test_123",
		"OUTBOX_PAYMENT_API_BASE="+stripeBase,
		"OUTBOX_PAYMENT_TIMEOUT=2s",
		"OUTBOX_SMTP_ADDR="+smtpAddr,
		"OUTBOX_SMTP_TLS=none",
		"OUTBOX_SMTP_TIMEOUT=2s",
		"OUTBOX_EMAIL_FROM=Outbox <outbox@example.com>",
		"OUTBOX_EMAIL_ON_AMBIGUOUS=hold",
		"OUTBOX_EMAIL_CONCURRENCY=4",
		"OUTBOX_SLACK_TOKEN="+slacktest.Token,
		"OUTBOX_SLACK_API_BASE="+slackFake.APIBase(),
		"OUTBOX_SLACK_TIMEOUT=2s",
	)

	// The rows, in waves: one wave before each kill. Half have an ordering key.
	kinds := []string{"webhook", "webhook:crm", "payment", "email", "slack"}
	const rowsPerWave, apiPerWave, orderingKeys = 36, 6, 8
	type row struct {
		msg outbox.Message
		api bool
	}
	var waves [][]row
	n := 0
	for range crashKills + 1 {
		var wave []row
		for i := range rowsPerWave + apiPerWave {
			n++
			kind := kinds[rng.IntN(len(kinds))]
			m := outbox.Message{Key: fmt.Sprintf("crash/%s/%d", strings.ReplaceAll(kind, ":", "-"), n), Connector: kind, Payload: crashPayload(kind, n)}
			switch {
			case rng.IntN(2) == 0:
			case kind == "email" || kind == "webhook:crm":
				// Keys of their own: a held row holds its key back for good.
				m.OrderingKey = fmt.Sprintf("hold-order-%d", rng.IntN(orderingKeys/2))
			default:
				m.OrderingKey = fmt.Sprintf("order-%d", rng.IntN(orderingKeys))
			}
			wave = append(wave, row{msg: m, api: i >= rowsPerWave})
		}
		waves = append(waves, wave)
	}
	// The kills: each after a seeded number of effects, counted from the wave before it.
	gaps := make([]int, crashKills)
	for i := range gaps {
		gaps[i] = 3 + rng.IntN(20)
	}
	t.Logf("kills after effects %v", gaps)

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	var unposted []outbox.Message // intents to send through the API, carried over a kill
	post := func(base string, m outbox.Message) error {
		body, err := json.Marshal(map[string]any{"connector": m.Connector, "payload": m.Payload, "ordering_key": m.OrderingKey})
		require.NoError(t, err)
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/intents", bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Idempotency-Key", m.Key)
		resp, err := client.Do(req)
		if err != nil {
			return err // the process died: the next one takes it
		}
		answer, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		// 200 is the answer to a request whose first try was taken before the process
		// died and whose answer was lost.
		require.Contains(t, []int{http.StatusCreated, http.StatusOK}, resp.StatusCode, "%s: %s", m.Key, answer)
		return nil
	}

	var children []*crashChild
	t.Cleanup(func() {
		for _, c := range children {
			c.kill()
			<-c.exited
		}
		if t.Failed() {
			for i, c := range children {
				t.Logf("process %d stderr (last 8 KiB):\n%s", i, tail(c.stderr.String(), 8<<10))
			}
		}
	})
	// crashRelays processes run at once, and the kills take them in turn: the other one
	// goes on delivering, and takes the killed one's rows once their leases run out.
	slots := make([]*crashChild, crashRelays)
	start := func(i int) {
		slots[i] = startCrashChild(t, environ)
		children = append(children, slots[i])
	}
	postAll := func() {
		for _, c := range slots {
			base, ok := c.httpBase(t)
			for ok && len(unposted) > 0 {
				if post(base, unposted[0]) != nil {
					break
				}
				unposted = unposted[1:]
			}
		}
	}
	// Every row finishes: nothing pending or leased is left once the last processes have
	// reclaimed the rows of the killed ones, but the rows that wait behind a held row of
	// their ordering key, as they must.
	const openSQL = `(status NOT IN ('delivered', 'dead', 'held') OR lease_owner IS NOT NULL) AND NOT ` + blockedSQL
	openRows := func() (open, total int) {
		t.Helper()
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE `+openSQL+`), count(*) FROM outbox o`).
			Scan(&open, &total))
		return open, total
	}
	killed := 0 // by SIGKILL: a stopped process may exit before the next effect
	for stage := range crashKills + 1 {
		if stage == 0 {
			for i := range slots {
				start(i)
			}
		}
		var victim *crashChild
		if stage < crashKills {
			victim = slots[stage%crashRelays]
			effects.arm(victim, effects.count()+gaps[stage], stage%3 == 2)
		}
		for _, r := range waves[stage] {
			if r.api {
				unposted = append(unposted, r.msg)
				continue
			}
			_, err := outbox.Enqueue(t.Context(), pool, r.msg)
			require.NoError(t, err)
		}
		postAll()
		if victim == nil {
			break
		}
		// Should the rows run out before the effects do (held rows and those behind them
		// have none), the victim is killed where it stands.
		deadline := time.Now().Add(processWait)
	wait:
		for {
			select {
			case <-victim.exited:
				break wait
			case <-time.After(50 * time.Millisecond):
			}
			if open, _ := openRows(); open == 0 && effects.disarm() {
				t.Logf("kill %d: no row left to deliver; killed without an effect", stage)
				victim.kill()
			}
			if time.Now().After(deadline) {
				t.Fatalf("kill %d did not happen within %s", stage, processWait)
			}
		}
		if stage%3 != 2 || victim.waitErr != nil {
			require.True(t, victim.killedBySIGKILL(), "process %d ended by itself: %v", len(children)-1, victim.waitErr)
			killed++
		}
		start(stage % crashRelays)
	}
	require.Empty(t, unposted, "the last processes take every intent sent through the API")

	// Every row finishes.
	waitFinished := func() {
		t.Helper()
		deadline := time.Now().Add(processWait)
		for {
			open, total := openRows()
			if open == 0 && total == n {
				break
			}
			for _, c := range slots {
				select {
				case <-c.exited:
					t.Fatalf("a last process exited (%v) with %d of %d rows open", c.waitErr, open, total)
				default:
				}
			}
			if time.Now().After(deadline) {
				rows, err := pool.Query(t.Context(), `SELECT idempotency_key, connector, status, attempts, coalesce(ordering_key, ''), coalesce(last_error, '')
					FROM outbox o WHERE `+openSQL+` ORDER BY id`)
				require.NoError(t, err)
				for rows.Next() {
					var key, conn, status, ok, lastErr string
					var attempts int
					require.NoError(t, rows.Scan(&key, &conn, &status, &attempts, &ok, &lastErr))
					t.Logf("open: %s %s %s attempts=%d ordering=%q last_error=%q", key, conn, status, attempts, ok, lastErr)
				}
				t.Fatalf("gave up after %s: %d of %d rows open", processWait, open, total)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFinished()

	// Each row as its guarantee says.
	type finished struct {
		key, connector, status, orderingKey string
		ambiguous, blocked                  bool
		result                              []byte
	}
	var all []finished
	rows, err := pool.Query(t.Context(), `SELECT idempotency_key, connector, status, coalesce(ordering_key, ''), ambiguous, coalesce(result, 'null'), `+blockedSQL+`
		FROM outbox o ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var f finished
		require.NoError(t, rows.Scan(&f.key, &f.connector, &f.status, &f.orderingKey, &f.ambiguous, &f.result, &f.blocked))
		all = append(all, f)
	}
	require.NoError(t, rows.Err())
	require.Len(t, all, n)
	held, blocked := 0, 0
	for _, f := range all {
		if f.blocked {
			blocked++
			require.Equal(t, "pending", f.status, f.key)
			require.Empty(t, effects.seqs(f.key), "%s: a row waiting behind a held one acted", f.key)
			continue
		}
		switch f.connector {
		case "webhook":
			require.Equal(t, "delivered", f.status, f.key)
			require.Equal(t, 1, hook.Effects(f.key), "%s: effects at the receiver", f.key)
		case "webhook:crm":
			switch f.status {
			case "delivered":
				require.Equal(t, 1, crm.Effects(f.key), "%s: effects at the receiver", f.key)
			case "held":
				held++
				require.True(t, f.ambiguous, "%s: held without an ambiguous attempt", f.key)
				require.LessOrEqual(t, crm.Effects(f.key), 1, "%s: effects at the receiver", f.key)
			default:
				t.Fatalf("%s: forwarded row %s", f.key, f.status)
			}
		case "slack":
			require.Equal(t, "delivered", f.status, f.key)
			require.Equal(t, 1, slackFake.Effects(f.key), "%s: messages carrying the key", f.key)
		case "payment":
			require.Equal(t, "delivered", f.status, f.key)
			var res struct{ Object, ID string }
			require.NoError(t, json.Unmarshal(f.result, &res), f.key)
			require.Equal(t, "payment_intent", res.Object, "%s: %s", f.key, f.result)
			bodies := payments.bodies(f.key)
			require.NotEmpty(t, bodies, f.key)
			for _, b := range bodies[1:] {
				require.Equal(t, bodies[0], b, "%s: every attempt sends the same request under the key", f.key)
			}
		case "email":
			sent := mails.count(f.key)
			switch f.status {
			case "delivered":
				require.Equal(t, 1, sent, "%s: messages sent", f.key)
			case "held":
				// Held after an ambiguous attempt, never sent again.
				held++
				require.True(t, f.ambiguous, "%s: held without an ambiguous attempt", f.key)
				require.LessOrEqual(t, sent, 1, "%s: messages sent", f.key)
			default:
				t.Fatalf("%s: forwarded row %s", f.key, f.status)
			}
		}
	}
	require.Empty(t, hook.DuplicateKeys())
	require.Empty(t, crm.DuplicateKeys(), "a forwarded row with the hold policy was sent again")
	require.Empty(t, payments.keyless(), "payment requests without an Idempotency-Key")
	paymentKeys := map[string]bool{}
	for _, f := range all {
		if f.connector == "payment" {
			paymentKeys[f.key] = true
		}
	}
	require.Empty(t, payments.unknownKeys(paymentKeys), "payment requests under a key no payment row has")

	// Per ordering key, every effect of a row came before any of the next one's, and
	// every row that finished delivered had one.
	checkOrder := func() {
		t.Helper()
		rows, err := pool.Query(t.Context(), `SELECT idempotency_key, status, coalesce(ordering_key, '') FROM outbox ORDER BY id`)
		require.NoError(t, err)
		byOrder := map[string][]string{}
		for rows.Next() {
			var key, status, ok string
			require.NoError(t, rows.Scan(&key, &status, &ok))
			if status == "delivered" {
				require.NotEmpty(t, effects.seqs(key), "%s: delivered without an effect", key)
			}
			if ok != "" && len(effects.seqs(key)) > 0 {
				byOrder[ok] = append(byOrder[ok], key)
			}
		}
		require.NoError(t, rows.Err())
		for ok, keys := range byOrder {
			for i := 1; i < len(keys); i++ {
				before, after := effects.seqs(keys[i-1]), effects.seqs(keys[i])
				require.Less(t, slices.Max(before), slices.Min(after),
					"ordering key %s: %s (effects %v) before %s (effects %v)", ok, keys[i-1], before, keys[i], after)
			}
		}
	}
	checkOrder()

	// The attempts log holds each attempt once, numbered from 1 as the row counts them,
	// all ended; a delivered row's last is its delivery, and no receiver saw more
	// requests for a row than it counted attempts.
	type attempts struct {
		counted, logged, distinct, first, last, open int
		lastOutcome                                  string
	}
	byKey := map[string]attempts{}
	rows, err = pool.Query(t.Context(), `SELECT o.idempotency_key, o.attempts, count(a.id), count(DISTINCT a.attempt),
			coalesce(min(a.attempt), 0), coalesce(max(a.attempt), 0), count(a.id) FILTER (WHERE a.finished_at IS NULL),
			coalesce((SELECT outcome FROM outbox_attempts l WHERE l.outbox_id = o.id ORDER BY l.attempt DESC, l.id DESC LIMIT 1), '')
		FROM outbox o LEFT JOIN outbox_attempts a ON a.outbox_id = o.id GROUP BY o.id`)
	require.NoError(t, err)
	for rows.Next() {
		var key string
		var a attempts
		require.NoError(t, rows.Scan(&key, &a.counted, &a.logged, &a.distinct, &a.first, &a.last, &a.open, &a.lastOutcome))
		byKey[key] = a
	}
	require.NoError(t, rows.Err())
	for _, f := range all {
		a := byKey[f.key]
		require.Equal(t, attempts{a.counted, a.counted, a.counted, min(a.counted, 1), a.counted, 0, a.lastOutcome}, a, "%s: attempts", f.key)
		if f.status == "delivered" {
			require.Equal(t, "delivered", a.lastOutcome, f.key)
		}
		var sent int
		switch f.connector {
		case "webhook":
			sent = hook.Requests(f.key)
		case "webhook:crm":
			sent = crm.Requests(f.key)
		case "payment":
			sent = len(payments.bodies(f.key))
		case "slack":
			sent = slackFake.Posts(f.key)
		case "email":
			sent = mails.count(f.key)
		}
		require.LessOrEqual(t, sent, a.counted, "%s: requests sent, attempts counted", f.key)
	}

	// The kills struck mid-delivery: each left an attempt that the next process found
	// abandoned.
	var abandoned int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox_attempts WHERE outcome = 'lease_expired' OR ambiguous`).Scan(&abandoned))
	require.GreaterOrEqual(t, abandoned, killed, "ambiguous attempts")
	t.Logf("%d kills, %d rows, %d effects, %d ambiguous attempts, %d rows held, %d behind them", killed, n, effects.count(), abandoned, held, blocked)

	// An operator replays the held rows, as the README says to: each is sent once more
	// (its receiver may have acted on it already), and the rows behind it go too. No
	// process is killed now, but an attempt that timed out on a busy machine holds its
	// row again, to be replayed again.
	sends := func(f finished) int { // of the forwarded instances, the only ones that hold
		if f.connector == "webhook:crm" {
			return crm.Effects(f.key)
		}
		return mails.count(f.key)
	}
	heldBefore := map[string]int{}
	for _, f := range all {
		if f.status == "held" {
			heldBefore[f.key] = sends(f)
		}
	}
	for replays := 0; ; replays++ {
		var heldNow int
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE status = 'held'`).Scan(&heldNow))
		if heldNow == 0 {
			break
		}
		require.Less(t, replays, 5, "rows held again after every replay")
		code, stdout, stderr := runCLI(t, []string{"OUTBOX_DATABASE_URL=" + dsn}, strings.NewReader(""),
			"replay", "--status", "held", "--yes", "--reason", "crash test")
		require.Equal(t, exitOK, code, "replay:\n%s%s", stdout, stderr)
		waitFinished()
	}
	var undelivered int
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE status <> 'delivered'`).Scan(&undelivered))
	require.Zero(t, undelivered, "rows not delivered once the held ones were replayed")
	for _, f := range all {
		if before, ok := heldBefore[f.key]; ok {
			require.Greater(t, sends(f), before, "%s: a replayed row was sent", f.key)
			continue
		}
		if f.blocked {
			// It waited behind a held row, and was never sent before.
			switch f.connector {
			case "webhook":
				require.Equal(t, 1, hook.Effects(f.key), f.key)
			case "slack":
				require.Equal(t, 1, slackFake.Effects(f.key), f.key)
			case "webhook:crm":
				require.GreaterOrEqual(t, crm.Effects(f.key), 1, f.key)
			case "email":
				require.GreaterOrEqual(t, mails.count(f.key), 1, f.key)
			case "payment":
				require.NotEmpty(t, payments.bodies(f.key), f.key)
			}
		}
	}
	checkOrder()

	for _, c := range slots {
		require.NoError(t, c.cmd.Process.Signal(syscall.SIGTERM))
	}
	for _, c := range slots {
		select {
		case <-c.exited:
		case <-time.After(processWait):
			t.Fatalf("a last process did not exit within %s of SIGTERM", processWait)
		}
		require.NoError(t, c.waitErr)
	}
}

// blockedSQL is true of a row of outbox o that waits behind a held row of its ordering
// key.
const blockedSQL = `(o.status = 'pending' AND EXISTS (SELECT 1 FROM outbox h
	WHERE h.ordering_key = o.ordering_key AND h.id < o.id AND h.status = 'held'))`

// crashPayload is row n's payload for kind.
func crashPayload(kind string, n int) any {
	switch kind {
	case "payment":
		return map[string]any{"operation": "payment_intent.create", "params": map[string]any{
			"amount": 1000 + n, "currency": "usd", "payment_method_types": []string{"card"},
			"metadata": map[string]string{"row": fmt.Sprint(n)},
		}}
	case "email":
		return map[string]any{"to": "customer@example.com", "subject": fmt.Sprintf("row %d", n), "text": "hello"}
	case "slack":
		return map[string]any{"channel": "C0CRASH", "text": fmt.Sprintf("row %d", n)}
	}
	return map[string]any{"n": n}
}

// crashEffects numbers the effects of every receiver in one sequence, by key, and kills
// the armed process once the count reaches its mark: from inside the receiver, after
// the effect and before the answer.
type crashEffects struct {
	mu        sync.Mutex
	seq       int
	byKey     map[string][]int
	armed     *crashChild
	killAt    int
	stopFirst bool // SIGTERM at killAt, SIGKILL at the next effect
	stopping  bool
}

func (e *crashEffects) observe(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seq++
	e.byKey[key] = append(e.byKey[key], e.seq)
	switch {
	case e.armed == nil:
	case e.stopping:
		// An effect of the drain: kill it now.
		e.armed.kill()
		e.armed, e.stopping = nil, false
	case e.seq >= e.killAt && e.stopFirst:
		// Stop it gracefully, and kill it in the middle of its drain, should another
		// effect come before it exits.
		_ = e.armed.cmd.Process.Signal(syscall.SIGTERM)
		e.stopping = true
	case e.seq >= e.killAt:
		e.armed.kill()
		e.armed = nil
	}
}

// disarm reports whether a process was armed, and disarms it.
func (e *crashEffects) disarm() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	armed := e.armed != nil && !e.stopping
	e.armed = nil
	return armed
}

// arm makes the effect numbered at (or the next one, if the count is past it) kill c.
func (e *crashEffects) arm(c *crashChild, at int, stopFirst bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.armed, e.killAt, e.stopFirst, e.stopping = c, at, stopFirst, false
}

func (e *crashEffects) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seq
}

// seqs are key's effects' numbers.
func (e *crashEffects) seqs(key string) []int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.byKey[key])
}

// crashChild is one `outboxd serve` process (the test binary, see TestMain).
type crashChild struct {
	cmd     *exec.Cmd
	stderr  lockedBuffer
	exited  chan struct{}
	waitErr error
}

func startCrashChild(t *testing.T, environ []string) *crashChild {
	t.Helper()
	c := &crashChild{exited: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = environ
	c.cmd.Stderr = &c.stderr
	require.NoError(t, c.cmd.Start())
	go func() { c.waitErr = c.cmd.Wait(); close(c.exited) }()
	return c
}

// kill sends SIGKILL and returns without waiting.
func (c *crashChild) kill() { _ = c.cmd.Process.Kill() }

func (c *crashChild) killedBySIGKILL() bool {
	ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// httpBase waits for the process's HTTP server and returns its root URL, or false when
// the process is gone first.
func (c *crashChild) httpBase(t *testing.T) (string, bool) {
	t.Helper()
	deadline := time.Now().Add(processWait)
	for {
		if rec, ok := findLog(c.stderr.String(), "http server listening"); ok {
			if addr, _ := rec["addr"].(string); addr != "" {
				return "http://" + addr, true
			}
		}
		select {
		case <-c.exited:
			return "", false
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no HTTP server after %s", processWait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// crashMails counts the messages an SMTP server accepted, by Idempotency-Key.
type crashMails struct {
	mu    sync.Mutex
	byKey map[string]int
}

func (m *crashMails) count(key string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byKey[key]
}

// startCrashSMTP runs an SMTP server (go-smtp) on loopback that accepts every message
// and calls observe with its Idempotency-Key before it replies.
func startCrashSMTP(t *testing.T, observe func(key string)) (string, *crashMails) {
	t.Helper()
	mails := &crashMails{byKey: map[string]int{}}
	srv := smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) {
		return &crashSession{mails: mails, observe: observe}, nil
	}))
	srv.Domain = "localhost"
	srv.ErrorLog = log.New(io.Discard, "", 0) // the killed clients' sessions would fill the output
	srv.ReadTimeout = time.Minute
	srv.WriteTimeout = time.Minute
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		_ = l.Close() // Close misses a listener that Serve has not registered yet
		<-done
	})
	return l.Addr().String(), mails
}

type crashSession struct {
	mails   *crashMails
	observe func(string)
}

func (*crashSession) Mail(string, *smtp.MailOptions) error { return nil }
func (*crashSession) Rcpt(string, *smtp.RcptOptions) error { return nil }
func (*crashSession) Reset()                               {}
func (*crashSession) Logout() error                        { return nil }

func (s *crashSession) Data(r io.Reader) error {
	msg, err := mail.ReadMessage(r)
	if err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, msg.Body); err != nil {
		return err
	}
	key := msg.Header.Get("Idempotency-Key")
	s.mails.mu.Lock()
	s.mails.byKey[key]++
	s.mails.mu.Unlock()
	s.observe(key)
	return nil
}

// crashPayments records the Stripe requests that went through the proxy, by
// Idempotency-Key.
type crashPayments struct {
	mu     sync.Mutex
	byKey  map[string][]string // the request bodies
	noKeys int
}

func (p *crashPayments) bodies(key string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.byKey[key])
}

func (p *crashPayments) keyless() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.noKeys
}

// unknownKeys are the keys seen that known does not hold.
func (p *crashPayments) unknownKeys(known map[string]bool) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for k := range p.byKey {
		if !known[k] {
			out = append(out, k)
		}
	}
	return out
}

// startStripeProxy runs a loopback proxy to stripe-mock, which is stateless and so
// cannot say how keys were used: the proxy records each request's key and body, and
// calls observe with the key once stripe-mock has answered, before passing the answer
// on.
func startStripeProxy(t *testing.T, upstream string, observe func(key string)) (string, *crashPayments) {
	t.Helper()
	p := &crashPayments{byKey: map[string][]string{}}
	client := &http.Client{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return // the relay is gone
		}
		req, err := http.NewRequestWithContext(r.Context(), r.Method, upstream+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		req.Header = r.Header.Clone()
		resp, err := client.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		answer, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		p.mu.Lock()
		if key == "" {
			p.noKeys++
		} else {
			p.byKey[key] = append(p.byKey[key], string(body))
		}
		p.mu.Unlock()
		observe(key)
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(answer)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, p
}
