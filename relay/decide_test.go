package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/internal/pgtest"
)

// declared is a connector that only declares: its guarantee, key window and time limit.
// decide never calls it.
type declared struct {
	g       connectors.Guarantee
	window  time.Duration
	timeout time.Duration
}

func (declared) Deliver(context.Context, connectors.Delivery) (json.RawMessage, error) {
	panic("decide never delivers")
}
func (d declared) Guarantee() connectors.Guarantee { return d.g }
func (d declared) KeyWindow() time.Duration        { return d.window }
func (d declared) Timeout() time.Duration          { return d.timeout }

// panicking is a connector whose attempt panics, as safeDeliver meets it.
type panicking struct{ declared }

func (panicking) Deliver(context.Context, connectors.Delivery) (json.RawMessage, error) {
	panic("decoding the answer")
}

// decide across guarantee × hold policy × error class × position, on an injected clock:
// the state, the ambiguous mark, next_attempt_at, the attempts log's outcome and what
// last_error tells a person to expect or do.
func TestDecideMatrix(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	pool, err := pgxpool.New(t.Context(), "postgres://outboxd@"+pgtest.UnreachableAddr(t)+"/outboxd")
	require.NoError(t, err) // never connects: decide is pure
	t.Cleanup(pool.Close)
	const maxAttempts = 5
	r, err := New(pool, &Config{
		Registerer: prometheus.NewRegistry(), Logger: testLogger(), NowFunc: func() time.Time { return now },
		MaxAttempts: maxAttempts, MaxAge: 72 * time.Hour, BackoffBase: time.Minute, BackoffMax: time.Hour,
	}, map[string]Instance{
		"webhook":         {Connector: declared{g: connectors.Enforced, timeout: 10 * time.Second}},
		"payment":         {Connector: declared{g: connectors.Enforced, window: 24 * time.Hour, timeout: 10 * time.Second}},
		"payment:long":    {Connector: declared{g: connectors.Enforced, window: 24 * time.Hour, timeout: 10 * time.Second}, MaxAge: 72 * time.Hour},
		"slack":           {Connector: declared{g: connectors.Reconciled, timeout: 10 * time.Second}},
		"email":           {Connector: declared{g: connectors.Forwarded, timeout: 10 * time.Second}},
		"email:hold":      {Connector: declared{g: connectors.Forwarded, timeout: 10 * time.Second}, OnAmbiguous: AmbiguousHold},
		"webhook:panics":  {Connector: panicking{declared{g: connectors.Forwarded, timeout: 10 * time.Second}}, OnAmbiguous: AmbiguousHold},
		"webhook:panicsr": {Connector: panicking{declared{g: connectors.Enforced, timeout: 10 * time.Second}}},
	})
	require.NoError(t, err)
	require.Equal(t, 24*time.Hour-10*time.Second, r.instances["payment"].maxAge, "inside the key window by default")

	var (
		permanent     = connectors.Permanent(errors.New("receiver answered 400 Bad Request"))
		retryable     = errors.New("receiver answered 503 Service Unavailable")
		timeoutUnsent = errors.New("the request could not be sent within 10s")
		ambiguous     = connectors.Ambiguous(errors.New("connection closed after the request was sent"))
		ambPermanent  = connectors.Ambiguous(connectors.Permanent(errors.New("receiver answered 303 See Other")))
		retryAfter    = func(d time.Duration) error {
			return connectors.RetryAfter(errors.New("receiver answered 429 Too Many Requests"), d)
		}
		ambAfter = func(d time.Duration) error { return connectors.Ambiguous(retryAfter(d)) }
	)
	// Positions: attempt number and first attempt.
	type position struct {
		attempt int
		firstAt time.Time
	}
	var (
		first  = position{1, now}
		middle = position{3, now.Add(-time.Hour)}
		last   = position{maxAttempts, now.Add(-2 * time.Hour)}
		// The next attempt (backoff 2m ±20% after attempt 2) would come past 72h.
		oldAge = position{2, now.Add(-72*time.Hour + time.Minute)}
		// Past the payment instances' default maximum age (the key window less 10s).
		oldKey = position{2, now.Add(-24*time.Hour + time.Minute)}
	)
	const backoff = "backoff"
	for _, tc := range []struct {
		name      string
		inst      string
		pos       position
		err       error
		status    string
		ambiguous bool
		next      any // nil, backoff (the computed one, ±20%), or a time.Duration from now
		says      string
	}{
		// Permanent: dead at once, wherever it falls.
		{"enforced permanent first", "webhook", first, permanent, statusDead, false, nil, "(permanent: not retried)"},
		{"hold permanent middle", "email:hold", middle, permanent, statusDead, false, nil, "(permanent: not retried)"},
		{"enforced ambiguous permanent", "webhook", first, ambPermanent, statusDead, true, nil, "(permanent: not retried)"},

		// Retryable, with and without Retry-After.
		{"enforced retryable first", "webhook", first, retryable, statusPending, false, backoff, "(retrying at "},
		{"enforced timeout unsent middle", "webhook", middle, timeoutUnsent, statusPending, false, backoff, "(retrying at "},
		{"forwarded retryable middle", "email", middle, retryable, statusPending, false, backoff, "(retrying at "},
		{"hold retryable middle", "email:hold", middle, retryable, statusPending, false, backoff, "(retrying at "},
		{"enforced retryable last", "webhook", last, retryable, statusDead, false, nil, "(gave up after 5 attempts)"},
		{"enforced retryable past max age", "webhook", oldAge, retryable, statusDead, false, nil, "would be later than the maximum age 72h0m0s"},
		{"enforced Retry-After", "webhook", middle, retryAfter(90 * time.Second), statusPending, false, 90 * time.Second, "Retry-After asked"},
		{"enforced Retry-After past the cap", "webhook", first, retryAfter(3 * time.Hour), statusPending, false, 3 * time.Hour, "Retry-After asked"},
		{"enforced Retry-After past max age", "webhook", middle, retryAfter(72 * time.Hour), statusDead, false, nil, "as the receiver's Retry-After asked, would be later than the maximum age"},
		{"enforced Retry-After zero", "webhook", middle, retryAfter(0), statusPending, false, backoff, "(retrying at "},
		{"enforced Retry-After last", "webhook", last, retryAfter(time.Second), statusDead, false, nil, "(gave up after 5 attempts)"},

		// Past a receiver's key window: dead by the default maximum age, held past an
		// explicit one.
		{"window retryable past default age", "payment", oldKey, retryable, statusDead, false, nil, "maximum age 23h59m50s"},
		{"window retryable past window", "payment:long", oldKey, retryable, statusHeld, false, nil, "remembers idempotency keys for 24h0m0s"},
		{"window Retry-After past default age", "payment", middle, retryAfter(23 * time.Hour), statusDead, false, nil, "maximum age 23h59m50s"},
		{"window Retry-After past window", "payment:long", middle, retryAfter(23 * time.Hour), statusHeld, false, nil, "replay with a new key or cancel"},
		{"window ambiguous Retry-After past window", "payment:long", middle, ambAfter(23 * time.Hour), statusHeld, true, nil, "replay with a new key or cancel"},
		{"window Retry-After inside", "payment:long", middle, retryAfter(22 * time.Hour), statusPending, false, 22 * time.Hour, "Retry-After asked"},

		// Ambiguous: enforced and reconciled retry (marked, so the reconciled one looks
		// first); forwarded retries by default, or holds.
		{"enforced ambiguous first", "webhook", first, ambiguous, statusPending, true, backoff, "(retrying at "},
		{"enforced ambiguous Retry-After", "webhook", first, ambAfter(time.Minute), statusPending, true, time.Minute, "Retry-After asked"},
		{"enforced ambiguous last", "webhook", last, ambiguous, statusDead, true, nil, "(gave up after 5 attempts)"},
		{"reconciled ambiguous middle", "slack", middle, ambiguous, statusPending, true, backoff, "(retrying at "},
		{"reconciled ambiguous past max age", "slack", oldAge, ambiguous, statusDead, true, nil, "maximum age 72h0m0s"},
		{"forwarded retry ambiguous middle", "email", middle, ambiguous, statusPending, true, backoff, "(retrying at "},
		{"forwarded retry ambiguous last", "email", last, ambiguous, statusDead, true, nil, "(gave up after 5 attempts)"},
		{"hold ambiguous first", "email:hold", first, ambiguous, statusHeld, true, nil, "held: replay or cancel it"},
		{"hold ambiguous last", "email:hold", last, ambiguous, statusHeld, true, nil, "held: replay or cancel it"},
		{"hold ambiguous past max age", "email:hold", oldAge, ambiguous, statusHeld, true, nil, "held: replay or cancel it"},
		{"hold ambiguous Retry-After", "email:hold", middle, ambAfter(time.Minute), statusHeld, true, nil, "held: replay or cancel it"},
		{"hold ambiguous permanent", "email:hold", first, ambPermanent, statusHeld, true, nil, "held: replay or cancel it"},
		{"forwarded retry ambiguous permanent", "email", first, ambPermanent, statusDead, true, nil, "(permanent: not retried)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			inst := r.instances[tc.inst]
			row := claimed{id: 1, attempt: tc.pos.attempt, firstAt: tc.pos.firstAt}
			o := r.decide(inst, row, nil, tc.err, now)
			requireDecided(t, o, tc.pos.attempt, tc.status, tc.ambiguous, tc.says)
			switch next := tc.next.(type) {
			case nil:
				require.Nil(t, o.nextAt, "no next attempt is scheduled")
			case string:
				want := time.Minute << (tc.pos.attempt - 1)
				require.NotNil(t, o.nextAt)
				require.WithinRange(t, *o.nextAt, now.Add(want*80/100), now.Add(want*120/100), "the computed backoff")
			case time.Duration:
				require.NotNil(t, o.nextAt)
				require.Equal(t, now.Add(next), *o.nextAt, "the receiver's Retry-After")
			}
		})
	}

	// A connector's panic is an ambiguous attempt.
	for name, want := range map[string]string{"webhook:panics": statusHeld, "webhook:panicsr": statusPending} {
		t.Run("panic "+name, func(t *testing.T) {
			t.Parallel()
			inst := r.instances[name]
			_, err := safeDeliver(t.Context(), inst.conn, connectors.Delivery{Key: "k", Attempt: 2})
			o := r.decide(inst, claimed{id: 1, attempt: 2, firstAt: now.Add(-time.Minute)}, nil, err, now)
			requireDecided(t, o, 2, want, true, "connector panicked: decoding the answer")
		})
	}
}

// requireDecided checks the outcome's state, its ambiguous mark, its attempts-log
// outcome and that last_error names the attempt and says says.
func requireDecided(t *testing.T, o outcome, attempt int, status string, ambiguous bool, says string) {
	t.Helper()
	require.NotNil(t, o.lastError)
	msg := *o.lastError
	require.Equal(t, status, o.status, msg)
	require.Equal(t, ambiguous, o.ambiguous, msg)
	wantRecord := status
	if status == statusPending {
		wantRecord = "retry"
	}
	require.Equal(t, wantRecord, o.record, msg)
	require.Contains(t, msg, fmt.Sprintf("attempt %d: ", attempt))
	require.Contains(t, msg, says)
}

// An instance whose receiver forgets keys gives up within its key window by default, at
// a maximum age shorter than Config.MaxAge (OUTBOX_MAX_AGE). last_error named only that
// age ("later than the maximum age 23h59m50s"), a figure the operator configured nowhere;
// it now says where it comes from.
func TestMaxAgeFromTheKeyWindowSaysSo(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	pool, err := pgxpool.New(t.Context(), "postgres://outboxd@"+pgtest.UnreachableAddr(t)+"/outboxd")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	r, err := New(pool, &Config{Registerer: prometheus.NewRegistry(), Logger: testLogger(), NowFunc: func() time.Time { return now }},
		map[string]Instance{
			"payment": {Connector: declared{g: connectors.Enforced, window: 24 * time.Hour, timeout: 10 * time.Second}},
			"webhook": {Connector: declared{g: connectors.Enforced, timeout: 10 * time.Second}},
		})
	require.NoError(t, err)
	row := claimed{id: 1, attempt: 2, firstAt: now.Add(-24 * time.Hour)}
	o := r.decide(r.instances["payment"], row, nil, errors.New("receiver answered 503 Service Unavailable"), now)
	require.Equal(t, statusDead, o.status)
	require.Contains(t, *o.lastError, "the maximum age 23h59m50s (payment remembers idempotency keys for 24h0m0s, less the attempt's time limit of 10s)")

	row.firstAt = now.Add(-72 * time.Hour)
	o = r.decide(r.instances["webhook"], row, nil, errors.New("receiver answered 503 Service Unavailable"), now)
	require.Equal(t, statusDead, o.status)
	require.Contains(t, *o.lastError, "the maximum age 72h0m0s)", "the configured maximum age needs no explanation")
}

// A retry that would reach a receiver after it forgets the key holds the row. When the
// receiver's Retry-After (or the backoff) set that retry's time, last_error said only
// "the first attempt was at <an hour ago>, so a retry now could act twice", which a
// person reads against a window of 24h as wrong: it did not say that the retry was due
// 23 hours later, nor that the receiver had asked for that wait.
func TestHeldPastTheKeyWindowSaysWhenTheRetryWouldBe(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	pool, err := pgxpool.New(t.Context(), "postgres://outboxd@"+pgtest.UnreachableAddr(t)+"/outboxd")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	r, err := New(pool, &Config{
		Registerer: prometheus.NewRegistry(), Logger: testLogger(), NowFunc: func() time.Time { return now },
		BackoffBase: time.Hour, BackoffMax: 48 * time.Hour,
	}, map[string]Instance{
		"payment": {Connector: declared{g: connectors.Enforced, window: 24 * time.Hour, timeout: 10 * time.Second}, MaxAge: 72 * time.Hour},
	})
	require.NoError(t, err)
	inst := r.instances["payment"]
	row := claimed{id: 1, attempt: 2, firstAt: now.Add(-time.Hour)}

	o := r.decide(inst, row, nil, connectors.RetryAfter(errors.New("Stripe answered 429 Too Many Requests"), 23*time.Hour), now)
	require.Equal(t, statusHeld, o.status, *o.lastError)
	require.NotContains(t, *o.lastError, "a retry now")
	require.Contains(t, *o.lastError, "a retry at 2026-12-01T11:00:00Z, 23h0m0s later as the receiver's Retry-After asked, could act twice")

	row.attempt = 6 // backoff 32h ±20%
	o = r.decide(inst, row, nil, errors.New("Stripe answered 503 Service Unavailable"), now)
	require.Equal(t, statusHeld, o.status, *o.lastError)
	require.NotContains(t, *o.lastError, "a retry now")
	require.Regexp(t, `so a retry at 2026-12-0\dT\d\d:\d\d:\d\dZ could act twice`, *o.lastError)
}
