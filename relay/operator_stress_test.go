package relay

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// stressPayload is what each row of TestOperatorsActWhileRelaysDeliver sends.
type stressPayload struct {
	I int    `json:"i"`
	O string `json:"o,omitempty"`
}

// Operators act on rows (replay by key and by filter, with a new key, with
// Redeliver, cancel, approve, reject, purge, purge of payloads) while three relays
// deliver them to a receiver that enforces keys and that fails, hangs, drops the
// connection after acting or refuses, and while a fourth relay "crashes" with rows
// claimed. Once everything has settled, what the table says must be true of what the
// receiver did, and every change an operator made must be in the audit trail. The run
// is random but bounded and seeded; only invariants are asserted, never a schedule.
func TestOperatorsActWhileRelaysDeliver(t *testing.T) {
	t.Parallel()
	for _, seed := range []uint64{1, 2, 4} {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			t.Parallel()
			stressOperators(t, seed)
		})
	}
}

func stressOperators(t *testing.T, seed uint64) {
	const rows, steps, orderingKeys = 160, 60, 5
	rnd := mrand.New(mrand.NewPCG(seed, 42))

	var (
		mu       sync.Mutex
		hang     = map[string]bool{} // keys whose first effect hangs until released
		dropFail = map[string]bool{} // keys answered 503 once they acted (after a dropped answer)
		open     = map[string]string{}
		dropKeys = map[string]bool{} // keys whose answer was lost after the effect
		overlaps []string
		served   = make(chan struct{}, 1)
		released = make(chan struct{})
	)
	release := sync.OnceFunc(func() { close(released) })
	b := setup(t, receiver.Options{OnEffect: func(e receiver.Effect) {
		mu.Lock()
		h := hang[e.Key]
		delete(hang, e.Key)
		mu.Unlock()
		if h {
			<-released
		}
	}})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		defer func() {
			select {
			case served <- struct{}{}:
			default:
			}
		}()
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		req.Body = io.NopCloser(strings.NewReader(string(body)))
		key := req.Header.Get("Idempotency-Key")
		var p stressPayload
		_ = json.Unmarshal(body, &p)
		mu.Lock()
		df := dropFail[key]
		if p.O != "" {
			if other, ok := open[p.O]; ok {
				overlaps = append(overlaps, fmt.Sprintf("%s sent while %s of ordering key %s was in flight", key, other, p.O))
			}
			open[p.O] = key
		}
		mu.Unlock()
		defer func() {
			if p.O != "" {
				mu.Lock()
				if open[p.O] == key {
					delete(open, p.O)
				}
				mu.Unlock()
			}
		}()
		if df && b.receiver.Effects(key) > 0 {
			http.Error(w, "planned failure after the effect", http.StatusServiceUnavailable)
			return
		}
		b.receiver.ServeHTTP(hijackSpy{w, func() {
			mu.Lock()
			dropKeys[key] = true
			mu.Unlock()
		}}, req)
	}))
	t.Cleanup(front.Close)
	t.Cleanup(release) // before front.Close, which waits for the requests hanging

	hook, err := webhook.New(webhook.Config{URL: front.URL, Guarantee: connectors.Enforced, Timeout: 20 * time.Second})
	require.NoError(t, err)
	fwd, err := webhook.New(webhook.Config{URL: front.URL, Guarantee: connectors.Forwarded, Timeout: 20 * time.Second})
	require.NoError(t, err)
	instances := map[string]Instance{
		"webhook":     {Connector: hook},
		"webhook:fwd": {Connector: fwd, OnAmbiguous: AmbiguousHold},
	}
	newRelay := func(id string) *Relay {
		cfg := b.fastConfig()
		cfg.ID, cfg.Registerer = id, prometheus.NewRegistry()
		cfg.BatchSize, cfg.Concurrency, cfg.MaxAttempts = 10, 8, 4
		r, err := New(b.pool, cfg, instances)
		require.NoError(t, err)
		r.parkBehindMin = 1
		return r
	}

	// The rows and their fates.
	type row struct {
		key, fate string
		approval  bool
	}
	var (
		all  []row
		msgs []outbox.Message
	)
	fateOf := map[string]string{}
	planFate := func(key, fate string) {
		mu.Lock()
		defer mu.Unlock()
		switch fate {
		case "retry":
			b.receiver.Plan(key, receiver.Plan{FailFirst: 2})
		case "exhaust":
			b.receiver.Plan(key, receiver.Plan{FailFirst: 1000})
		case "bad":
			b.receiver.Plan(key, receiver.Plan{PermanentStatus: http.StatusBadRequest})
		case "drop":
			b.receiver.Plan(key, receiver.Plan{DropAfterEffect: 1})
		case "dropfail":
			b.receiver.Plan(key, receiver.Plan{DropAfterEffect: 1})
			dropFail[key] = true
		case "hang":
			hang[key] = true
		}
	}
	fates := []string{"ok", "ok", "ok", "ok", "retry", "exhaust", "bad", "drop", "dropfail", "hang"}
	for i := range rows {
		r := row{key: fmt.Sprintf("s%d-%03d", seed, i), fate: fates[rnd.IntN(len(fates))], approval: rnd.IntN(12) == 0}
		m := outbox.Message{Key: r.key, Connector: "webhook", RequireApproval: r.approval}
		if rnd.IntN(5) == 0 {
			m.Connector = "webhook:fwd"
		}
		p := stressPayload{I: i}
		if rnd.IntN(5) < 2 {
			p.O = fmt.Sprintf("ok%d-%d", seed, rnd.IntN(orderingKeys))
			m.OrderingKey = p.O
		}
		m.Payload = p
		planFate(r.key, r.fate)
		fateOf[r.key] = r.fate
		all = append(all, r)
		msgs = append(msgs, m)
	}

	// What the operators did, to be found in the audit trail.
	var (
		audits  = map[string]map[string]int{} // by key, by action
		idOf    = map[string]int64{}
		copyOf  = map[string]string{} // new-key copy -> the key of the row it re-executes
		justify = map[string]int{}    // by operation: executions the operator was warned of
		silent  []string              // replays of operations that had acted, with no warning
		// warnedCopy are copies made with a warning that the operation may run twice.
		warnedCopy = map[string]bool{}
	)
	counted := func(key, action string) {
		if audits[key] == nil {
			audits[key] = map[string]int{}
		}
		audits[key][action]++
	}
	opOf := func(key string) string {
		if o, ok := copyOf[key]; ok {
			return o
		}
		return key
	}
	effectsOfOp := func(op string) int {
		n := b.receiver.Effects(op)
		for c, o := range copyOf {
			if o == op {
				n += b.receiver.Effects(c)
			}
		}
		return n
	}

	relays := []*Relay{newRelay("r1"), newRelay("r2"), newRelay("r3")}
	stops := make([]func(), len(relays))
	for i, r := range relays {
		stops[i] = run(t, r)
	}
	crasher := newRelay("crasher")
	ins, err := outbox.EnqueueBatch(t.Context(), b.pool, msgs)
	require.NoError(t, err)
	for _, in := range ins {
		idOf[in.Key] = in.ID
	}
	keys := slices.Collect(maps.Keys(idOf))
	slices.Sort(keys)
	pick := func() string {
		mu.Lock()
		defer mu.Unlock()
		cs := slices.Sorted(maps.Keys(copyOf))
		if len(cs) > 0 && rnd.IntN(4) == 0 {
			return cs[rnd.IntN(len(cs))]
		}
		return keys[rnd.IntN(len(keys))]
	}
	// pickDead is a row that is dead or held, or else any.
	pickDead := func() string {
		var dead []string
		rs, err := b.pool.Query(t.Context(), `SELECT idempotency_key FROM outbox WHERE status IN ('dead', 'held') ORDER BY id`)
		require.NoError(t, err)
		for rs.Next() {
			var k string
			require.NoError(t, rs.Scan(&k))
			dead = append(dead, k)
		}
		require.NoError(t, rs.Err())
		if len(dead) == 0 {
			return pick()
		}
		return dead[rnd.IntN(len(dead))]
	}
	crash := func() {
		for _, name := range []string{"webhook", "webhook:fwd"} {
			claimRows(t, crasher, name)
		}
		// The crasher died with them: its leases run out.
		_, err := b.pool.Exec(t.Context(), `UPDATE outbox SET lease_expires_at = now() - interval '1 second'
			WHERE lease_owner = 'crasher' AND status = 'delivering'`)
		require.NoError(t, err)
	}
	replay := func(sel ops.Selection, opts ops.ReplayOptions) {
		opts.Actor = "op"
		res, err := ops.Replay(t.Context(), b.pool, sel, opts)
		if err != nil {
			// A batch that waited too long for the relays' claims is to be run again.
			require.ErrorContains(t, err, "running the replay again is safe")
		}
		for _, k := range res.Replayed {
			counted(k, ops.ActionReplay)
			op, nk := opOf(k), ""
			if opts.NewKey {
				nk = res.NewKeys[k]
				in, err := outbox.Get(t.Context(), b.pool, nk)
				require.NoError(t, err)
				idOf[nk] = in.ID
				// The copy fares as its row did (unless a relay took it first).
				planFate(nk, fateOf[op])
				mu.Lock()
				copyOf[nk] = op
				mu.Unlock()
			}
			if _, warned := res.Ambiguous[k]; warned || opts.Redeliver {
				justify[op]++
				warnedCopy[nk] = true
				continue
			}
			if warnedCopy[k] {
				continue // put back under its own key, a copy made with the warning goes on
			}
			// Not warned: the operation had not acted under any other key than the one
			// replayed (a receiver that enforces keys acts on it at most once). The copy
			// itself may have been delivered since.
			other := effectsOfOp(op) - b.receiver.Effects(k)
			if nk != "" {
				other -= b.receiver.Effects(nk)
			}
			if other > 0 {
				silent = append(silent, fmt.Sprintf("%s: replayed (new key %v) without a warning though its operation %s had acted under another key",
					k, opts.NewKey, op))
			}
		}
	}

	for step := range steps {
		switch a := rnd.IntN(11); a {
		case 0:
			replay(ops.Selection{Keys: []string{pick(), pickDead()}}, ops.ReplayOptions{})
		case 1:
			st := []string{outbox.StatusDead, outbox.StatusHeld, outbox.StatusDelivering}[rnd.IntN(3)]
			replay(ops.Selection{Filter: &ops.Filter{Status: []string{st}, Limit: 4}}, ops.ReplayOptions{})
		case 2:
			replay(ops.Selection{Keys: []string{pickDead()}}, ops.ReplayOptions{NewKey: true})
		case 3:
			replay(ops.Selection{Filter: &ops.Filter{Status: []string{outbox.StatusDead}, Limit: 3}}, ops.ReplayOptions{NewKey: true})
		case 4:
			replay(ops.Selection{Keys: []string{pick()}}, ops.ReplayOptions{Redeliver: true, NewKey: rnd.IntN(2) == 0})
		case 5:
			res, err := ops.Cancel(t.Context(), b.pool, []string{pick(), pick()}, "op", "", time.Time{})
			require.NoError(t, err)
			for _, k := range res.Canceled {
				counted(k, ops.ActionCancel)
			}
		case 6, 7:
			k := pick()
			var err error
			if a == 6 {
				_, err = ops.Approve(t.Context(), b.pool, k, "op", "", time.Time{})
			} else {
				_, err = ops.Reject(t.Context(), b.pool, k, "op", "", time.Time{})
			}
			if err != nil && !errors.Is(err, outbox.ErrNotFound) { // purged
				require.ErrorIs(t, err, ops.ErrConflictState)
			}
		case 8:
			_, err := ops.Purge(t.Context(), b.pool, 0, ops.PurgeOptions{PayloadOnly: true, Actor: "op"})
			require.NoError(t, err)
		case 9:
			if rnd.IntN(3) == 0 {
				_, err := ops.Purge(t.Context(), b.pool, 0, ops.PurgeOptions{})
				require.NoError(t, err)
			} else {
				crash()
			}
		case 10:
			if step > steps/2 {
				release()
			}
		}
		// Let the relays get on between the operators' steps: the next step waits for a
		// request to be answered, or a tenth of a second when none comes (every row
		// finished or hanging). It paces the run and asserts nothing.
		select {
		case <-served:
		case <-time.After(100 * time.Millisecond):
		}
	}
	release()

	// The operators decide every row still awaiting approval, and the relays settle.
	var waiting []string
	rs, err := b.pool.Query(t.Context(), `SELECT idempotency_key FROM outbox WHERE status = 'awaiting_approval' ORDER BY id`)
	require.NoError(t, err)
	for rs.Next() {
		var k string
		require.NoError(t, rs.Scan(&k))
		waiting = append(waiting, k)
	}
	require.NoError(t, rs.Err())
	for i, k := range waiting {
		if i%2 == 0 {
			_, err = ops.Approve(t.Context(), b.pool, k, "op", "", time.Time{})
		} else {
			_, err = ops.Reject(t.Context(), b.pool, k, "op", "", time.Time{})
		}
		require.NoError(t, err)
	}
	const unsettledSQL = `
SELECT count(*) FROM outbox o
WHERE o.status = 'delivering'
   OR (o.status = 'pending' AND NOT EXISTS (
         SELECT 1 FROM outbox p WHERE p.ordering_key = o.ordering_key AND p.id < o.id
           AND p.status IN ('held', 'awaiting_approval')))`
	require.Eventually(t, func() bool {
		var n int
		return b.pool.QueryRow(t.Context(), unsettledSQL).Scan(&n) == nil && n == 0
	}, waitTimeout, 20*time.Millisecond, "every row is finished or waits for an operator")
	for _, stop := range stops {
		stop()
	}
	// A crash after the relays stopped: a relay's reclaim puts its rows back.
	crash()
	last := newRelay("last")
	last.reclaim(t.Context())
	var stuck int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM outbox WHERE status = 'delivering'`).Scan(&stuck))
	require.Zero(t, stuck, "no row is left delivering once reclaim ran")

	mu.Lock()
	defer mu.Unlock()
	var problems []string
	problem := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	problems = append(problems, overlaps...)

	// The table against the receiver, row by row.
	type state struct {
		id                 int64
		key, status, order string
		attempts           int
		lastError          string
		ambiguous          bool
		payloadEmpty       bool
		approval           bool
	}
	states := map[string]state{}
	rs, err = b.pool.Query(t.Context(), `SELECT id, idempotency_key, status, coalesce(ordering_key, ''), attempts,
		coalesce(last_error, ''), ambiguous, payload = '{}'::jsonb,
		EXISTS (SELECT 1 FROM outbox_audit a WHERE a.outbox_id = outbox.id AND a.details->>'from_status' = 'awaiting_approval')
		FROM outbox ORDER BY id`)
	require.NoError(t, err)
	for rs.Next() {
		var s state
		require.NoError(t, rs.Scan(&s.id, &s.key, &s.status, &s.order, &s.attempts, &s.lastError, &s.ambiguous,
			&s.payloadEmpty, &s.approval))
		states[s.key] = s
	}
	require.NoError(t, rs.Err())
	type attempt struct {
		n         int
		outcome   string
		ambiguous bool
		err       string
	}
	log := map[string][]attempt{}
	rs, err = b.pool.Query(t.Context(), `SELECT o.idempotency_key, a.attempt, a.outcome, a.ambiguous, coalesce(a.error, '')
		FROM outbox_attempts a JOIN outbox o ON o.id = a.outbox_id ORDER BY a.outbox_id, a.attempt, a.id`)
	require.NoError(t, err)
	for rs.Next() {
		var (
			k string
			a attempt
		)
		require.NoError(t, rs.Scan(&k, &a.n, &a.outcome, &a.ambiguous, &a.err))
		log[k] = append(log[k], a)
	}
	require.NoError(t, rs.Err())
	auditRows := map[string]map[string]int{}
	rs, err = b.pool.Query(t.Context(), `SELECT o.idempotency_key, a.action, count(*)
		FROM outbox_audit a JOIN outbox o ON o.id = a.outbox_id GROUP BY 1, 2`)
	require.NoError(t, err)
	for rs.Next() {
		var (
			k, action string
			n         int
		)
		require.NoError(t, rs.Scan(&k, &action, &n))
		if auditRows[k] == nil {
			auditRows[k] = map[string]int{}
		}
		auditRows[k][action] = n
	}
	require.NoError(t, rs.Err())

	for k, s := range states {
		effects := b.receiver.Effects(k)
		as := log[k]
		switch s.status {
		case outbox.StatusDelivered, outbox.StatusDead, outbox.StatusCanceled, outbox.StatusHeld, outbox.StatusAwaitingApproval:
		case outbox.StatusPending:
			// Only behind a row that waits for an operator (unsettledSQL).
		default:
			problem("%s: status %s after everything settled", k, s.status)
		}
		if effects > 1 {
			problem("%s: %d effects at a receiver that enforces keys", k, effects)
		}
		// The attempts log: one row per attempt, numbered 1..attempts.
		if len(as) != s.attempts {
			problem("%s: %d attempts, %d logged: %+v", k, s.attempts, len(as), as)
		}
		for i, a := range as {
			if a.n != i+1 {
				problem("%s: attempt %d logged as number %d: %+v", k, i+1, a.n, as)
				break
			}
		}
		delivered := false
		for _, a := range as {
			delivered = delivered || a.outcome == "delivered"
		}
		if delivered && effects == 0 {
			problem("%s: an attempt was logged delivered but the receiver never acted", k)
		}
		if dropKeys[k] && effects > 0 {
			amb := false
			for _, a := range as {
				amb = amb || a.ambiguous
			}
			if !amb {
				problem("%s: its answer was lost after the effect, but no attempt is marked ambiguous: %+v", k, as)
			}
		}
		if len(as) > 0 {
			l := as[len(as)-1]
			if l.ambiguous != s.ambiguous {
				problem("%s: row ambiguous=%v, its last attempt %+v", k, s.ambiguous, l)
			}
			switch s.status {
			case outbox.StatusDelivered:
				if l.outcome != "delivered" || effects != 1 {
					problem("%s: delivered, last attempt %+v, %d effects", k, l, effects)
				}
			case outbox.StatusDead:
				// A reclaim logs the abandoned attempt in its words and the row in its own.
				reclaimed := l.outcome == "lease_expired" && strings.Contains(s.lastError, "lost its lease during attempt "+fmt.Sprint(l.n))
				if (!strings.HasPrefix(s.lastError, l.err) && !reclaimed) || s.lastError == "" {
					problem("%s: dead with last_error %q, its last attempt %+v", k, s.lastError, l)
				}
				earlier := slices.ContainsFunc(as[:len(as)-1], func(a attempt) bool { return a.ambiguous })
				if earlier && !l.ambiguous && !strings.Contains(s.lastError, "was ambiguous") {
					problem("%s: dead after an ambiguous attempt, last_error %q does not say so", k, s.lastError)
				}
			case outbox.StatusHeld:
				if !l.ambiguous {
					problem("%s: held after an attempt that was not ambiguous: %+v", k, l)
				}
			}
		} else if s.status == outbox.StatusDelivered || s.status == outbox.StatusDead || s.status == outbox.StatusHeld {
			problem("%s: %s without an attempt", k, s.status)
		}
		if s.status == outbox.StatusDelivered && effects != 1 {
			problem("%s: delivered, %d effects", k, effects)
		}
		if strings.HasPrefix(s.lastError, outbox.ParkedPrefix) && s.status != outbox.StatusPending {
			problem("%s: %s, last_error still says it waits: %q", k, s.status, s.lastError)
		}
		// The audit trail: one row per change an operator was told of.
		for _, action := range []string{ops.ActionReplay, ops.ActionCancel} {
			if got, want := auditRows[k][action], audits[k][action]; got != want {
				problem("%s: %d %s audit rows for %d changes reported", k, got, action, want)
			}
		}
		decided := auditRows[k][ops.ActionApprove] + auditRows[k][ops.ActionReject]
		if decided > 1 {
			problem("%s: decided %d times", k, decided)
		}
		if s.payloadEmpty && auditRows[k][ops.ActionPurgePayload] != 1 {
			problem("%s: payload purged, %d purge_payload audit rows", k, auditRows[k][ops.ActionPurgePayload])
		}
	}
	for _, r := range all {
		s, ok := states[r.key]
		if !ok || !r.approval || s.status == outbox.StatusAwaitingApproval {
			continue
		}
		if !s.approval {
			problem("%s: left awaiting_approval (now %s) with no audit row of the decision", r.key, s.status)
		}
	}

	// Executions of one operation: the first, plus one for each new-key replay the
	// operator was warned about (Ambiguous) or asked for (Redeliver). A copy made without
	// either must have been made while the operation had not acted.
	problems = append(problems, silent...)
	for _, op := range keys {
		if n := effectsOfOp(op); n > 1+justify[op] {
			problem("%s: %d executions, %d of them warned of or asked for", op, n, justify[op])
		}
	}

	// Per ordering key, the effects in id order, but for rows an operator put back (a
	// replayed head goes after the rows that went on while it was dead).
	first := map[string]int{} // by key: seq of its first effect
	for _, e := range b.receiver.EffectLog() {
		if _, ok := first[e.Key]; !ok {
			first[e.Key] = e.Seq
		}
	}
	byOrder := map[string][]string{}
	for k := range first {
		if s, ok := states[k]; ok && s.order != "" {
			byOrder[s.order] = append(byOrder[s.order], k)
		}
	}
	for o, ks := range byOrder {
		slices.SortFunc(ks, func(a, b string) int { return int(idOf[a] - idOf[b]) })
		for i, a := range ks {
			if auditRows[a][ops.ActionReplay] > 0 || audits[a][ops.ActionReplay] > 0 {
				continue
			}
			for _, c := range ks[i+1:] {
				if first[c] < first[a] {
					problem("ordering key %s: %s (id %d) acted before %s (id %d)", o, c, idOf[c], a, idOf[a])
				}
			}
		}
	}

	slices.Sort(problems)
	require.Empty(t, problems[:min(len(problems), 20)], "%d problems", len(problems))
	t.Logf("seed %d: %d effects, %d new-key copies, statuses %v", seed, b.receiver.TotalEffects(), len(copyOf), countStatus(t, b.pool))
}

// hijackSpy tells when the receiver drops the connection (it hijacks it to close it).
type hijackSpy struct {
	http.ResponseWriter
	onHijack func()
}

func (s hijackSpy) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	s.onHijack()
	return http.NewResponseController(s.ResponseWriter).Hijack()
}
