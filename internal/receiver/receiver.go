package receiver

import (
	"cmp"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure a [Receiver]. The zero value is a receiver that always succeeds.
type Options struct {
	// FailRate is the fraction of requests, from 0 to 1, answered 503 before any effect,
	// at random. Defaults to 0.
	FailRate float64
	// Seed seeds the random numbers behind FailRate, so a run can be repeated. Defaults to 0.
	Seed int64
	// Secret, when set, is a Standard Webhooks secret ("whsec_<base64>", the prefix being
	// optional); requests without a valid signature get 401 and perform no effect.
	// Defaults to no verification.
	Secret string
	// Secrets are more secrets accepted besides Secret, in the same format: a signature
	// that matches any of them is valid, as for a receiver that holds both the old and
	// the new secret while the sender's is rotated. Defaults to none.
	Secrets []string
	// IgnoreKeys makes every request that gets past its plan perform an effect, as a
	// receiver that does not honour Idempotency-Key would. The key is still required and
	// counted, so [Receiver.DuplicateKeys] shows the duplicates. Defaults to false.
	IgnoreKeys bool
	// NoEffectLog keeps the counts but not the effect log (bodies and headers), for
	// benchmarks that deliver millions of rows; [Receiver.EffectLog] is then empty.
	// Defaults to false.
	NoEffectLog bool
	// OnEffect, when set, is called with each effect, on the request's goroutine, after
	// the effect is counted and before its answer is stored. The key stays in flight
	// while it runs (a concurrent request for it gets 409), so a test can block here to
	// hold a request open. Defaults to nil.
	OnEffect func(Effect)
}

// Plan scripts the answers for one key; see [Receiver.Plan]. The zero value means no
// scripted failure. Checks happen in field order: a PermanentStatus wins over FailFirst,
// which wins over the stored answer.
type Plan struct {
	// FailFirst answers the key's first N requests (counted from the Plan call) with
	// FailStatus, before any effect.
	FailFirst int
	// FailStatus is the status of the FailFirst answers. Defaults to 503.
	FailStatus int
	// RetryAfter is the Retry-After header sent with the FailFirst answers, as
	// delta-seconds ("3") or an HTTP date. Defaults to none.
	RetryAfter string
	// Date is the Date header sent with the FailFirst answers, the receiver's clock
	// when it answered. Defaults to the server's own (the machine's clock).
	Date string
	// DropAfterEffect closes the connection without answering, the first N times a
	// request for the key gets to the effect: the first performs the effect and stores
	// its answer, the next ones find it stored, and each of them is dropped. This is the
	// failure that matters most: the receiver acted and the sender cannot know.
	DropAfterEffect int
	// PermanentStatus, when set, answers every request for the key with this status
	// (meant for a 4xx) and performs no effect.
	PermanentStatus int
}

// Effect is one performed effect.
type Effect struct {
	// Key is the request's Idempotency-Key.
	Key string
	// Body is the request body, verbatim. Callers must not modify it.
	Body []byte
	// Headers are the request's headers. Callers must not modify them.
	Headers http.Header
	// At is when the request arrived.
	At time.Time
	// Seq numbers the effects from 1 over the whole receiver, in the order performed.
	Seq int
}

// Receiver is a running loopback HTTP receiver. Its methods are safe for concurrent use.
type Receiver struct {
	opts    Options
	secrets [][]byte // the keys of Options.Secret and Options.Secrets
	url     string
	srv     *http.Server
	served  chan struct{}

	seed   maphash.Seed
	shards [shardCount]shard

	total atomic.Int64
	conns atomic.Int64 // connections accepted
	seq   atomic.Int64 // with NoEffectLog only; otherwise Seq is the log's length

	logMu sync.Mutex
	log   []Effect

	closeOnce sync.Once
}

const (
	// shardCount spreads the per-key state over this many locks. It is a power of two
	// well above the number of CPUs of the machines the benchmark runs on.
	shardCount = 64
	// maxBody bounds a request body; a larger one gets 413.
	maxBody = 1 << 20
	// signatureTolerance is how far webhook-timestamp may be from the receiver's clock,
	// as in the Standard Webhooks reference libraries.
	signatureTolerance = 5 * time.Minute
	secretPrefix       = "whsec_"
)

type shard struct {
	mu   sync.Mutex
	keys map[string]*entry
	rng  *rand.Rand
}

// entry is one key's state, guarded by its shard's mutex.
type entry struct {
	plan     Plan
	failed   int // FailFirst answers given since the plan was set
	dropped  int // connections dropped since the plan was set
	requests int
	effects  int
	inFlight bool
	body     [sha256.Size]byte // hash of the body of the request that performed the effect
	hasBody  bool              // body is set: an effect started
	stored   []byte            // the first effect's answer body; nil until it is stored
}

// Start starts a receiver on 127.0.0.1 on a free port. Close it when done.
func Start(opts Options) (*Receiver, error) {
	if opts.FailRate < 0 || opts.FailRate > 1 {
		return nil, fmt.Errorf("receiver options: FailRate %v is outside [0, 1]", opts.FailRate)
	}
	r := &Receiver{opts: opts, seed: maphash.MakeSeed(), served: make(chan struct{})}
	if opts.Secret != "" {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(opts.Secret, secretPrefix))
		if err != nil || len(key) == 0 {
			return nil, errors.New("receiver options: Secret is not base64 after its whsec_ prefix")
		}
		r.secrets = append(r.secrets, key)
	}
	for i, s := range opts.Secrets {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, secretPrefix))
		if err != nil || len(key) == 0 {
			return nil, fmt.Errorf("receiver options: Secrets[%d] is not base64 after its whsec_ prefix", i)
		}
		r.secrets = append(r.secrets, key)
	}
	for i := range r.shards {
		r.shards[i].keys = make(map[string]*entry)
		r.shards[i].rng = rand.New(rand.NewPCG(uint64(opts.Seed), uint64(i)))
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen on loopback: %w", err)
	}
	r.url = "http://" + ln.Addr().String() + "/hook"
	r.srv = &http.Server{
		Handler:           r,
		ReadHeaderTimeout: 10 * time.Second,
		// Keep-alive stays on (the default): the connector's shared transport reuses
		// connections, and the benchmark measures the relay, not TCP handshakes.
		ConnState: func(_ net.Conn, state http.ConnState) {
			if state == http.StateNew {
				r.conns.Add(1)
			}
		},
	}
	go func() {
		defer close(r.served)
		_ = r.srv.Serve(ln) // returns http.ErrServerClosed after Close
	}()
	return r, nil
}

// URL is the address to POST to, http://127.0.0.1:<port>/hook. Any path is accepted.
func (r *Receiver) URL() string { return r.url }

// Close stops the receiver and closes its connections, including idle keep-alive ones.
// It does not wait for handlers blocked in [Options.OnEffect]. Calling it again does
// nothing.
func (r *Receiver) Close() {
	r.closeOnce.Do(func() {
		_ = r.srv.Close()
		<-r.served
	})
}

// Plan replaces the plan for key and restarts its counts: FailFirst and DropAfterEffect
// count from this call. Effects already performed for key stay performed and stored.
func (r *Receiver) Plan(key string, p Plan) {
	sh := r.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.entry(key)
	e.plan, e.failed, e.dropped = p, 0, 0
}

// Effects reports how many times the effect for key was performed: 0 or 1, unless
// [Options.IgnoreKeys] is set.
func (r *Receiver) Effects(key string) int {
	sh := r.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := sh.keys[key]; ok {
		return e.effects
	}
	return 0
}

// Requests reports how many requests carried key, whatever they were answered.
func (r *Receiver) Requests(key string) int {
	sh := r.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := sh.keys[key]; ok {
		return e.requests
	}
	return 0
}

// Connections is how many connections the receiver has accepted.
func (r *Receiver) Connections() int64 { return r.conns.Load() }

// TotalEffects reports how many effects were performed, over all keys.
func (r *Receiver) TotalEffects() int { return int(r.total.Load()) }

// EffectLog returns the effects performed so far, in the order performed (by
// [Effect.Seq]). It is empty with [Options.NoEffectLog].
func (r *Receiver) EffectLog() []Effect {
	r.logMu.Lock()
	defer r.logMu.Unlock()
	return slices.Clone(r.log)
}

// DuplicateKeys returns, sorted, the keys whose effect was performed more than once.
// It is always empty unless [Options.IgnoreKeys] is set.
func (r *Receiver) DuplicateKeys() []string {
	var dups []string
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		for k, e := range sh.keys {
			if e.effects > 1 {
				dups = append(dups, k)
			}
		}
		sh.mu.Unlock()
	}
	slices.Sort(dups)
	return dups
}

func (r *Receiver) shard(key string) *shard {
	return &r.shards[maphash.String(r.seed, key)%shardCount]
}

// entry returns key's entry, creating it. The caller holds sh.mu.
func (sh *shard) entry(key string) *entry {
	e, ok := sh.keys[key]
	if !ok {
		e = &entry{}
		sh.keys[key] = e
	}
	return e
}

// ServeHTTP answers one request; see the package documentation for the rules.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	at := time.Now()
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		answerError(w, http.StatusMethodNotAllowed, "only POST is accepted")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxBody))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			answerError(w, http.StatusRequestEntityTooLarge, "body over 1 MiB")
			return
		}
		answerError(w, http.StatusBadRequest, "read body: "+err.Error())
		return
	}
	if r.secrets != nil {
		if err := verifySignature(r.secrets, req.Header, body, at); err != nil {
			answerError(w, http.StatusUnauthorized, err.Error())
			return
		}
	}
	key := req.Header.Get("Idempotency-Key")
	if key == "" {
		answerError(w, http.StatusBadRequest, "missing Idempotency-Key header")
		return
	}

	sum := sha256.Sum256(body)
	sh := r.shard(key)
	sh.mu.Lock()
	e := sh.entry(key)
	e.requests++
	p := e.plan
	switch {
	case p.PermanentStatus != 0:
		sh.mu.Unlock()
		answerError(w, p.PermanentStatus, "planned permanent failure")
		return
	case e.failed < p.FailFirst:
		e.failed++
		sh.mu.Unlock()
		if p.RetryAfter != "" {
			w.Header().Set("Retry-After", p.RetryAfter)
		}
		if p.Date != "" {
			w.Header().Set("Date", p.Date)
		}
		answerError(w, cmp.Or(p.FailStatus, http.StatusServiceUnavailable), "planned failure")
		return
	case r.opts.FailRate > 0 && sh.rng.Float64() < r.opts.FailRate:
		sh.mu.Unlock()
		answerError(w, http.StatusServiceUnavailable, "random failure")
		return
	case e.hasBody && e.body != sum && !r.opts.IgnoreKeys:
		sh.mu.Unlock()
		answerError(w, http.StatusUnprocessableEntity,
			"this Idempotency-Key was already used with a different request body")
		return
	case e.stored != nil && !r.opts.IgnoreKeys:
		stored := e.stored
		drop := e.dropped < p.DropAfterEffect
		if drop {
			e.dropped++
		}
		sh.mu.Unlock()
		if drop {
			dropConnection(w)
			return
		}
		w.Header().Set("Idempotent-Replayed", "true")
		answer(w, http.StatusOK, stored)
		return
	case e.inFlight && !r.opts.IgnoreKeys:
		sh.mu.Unlock()
		answerError(w, http.StatusConflict, "a request with this Idempotency-Key is in progress; retry later")
		return
	}
	// This request performs the effect. Marking the key in flight and counting the
	// effect under one lock is what keeps two concurrent requests from both acting.
	e.inFlight = true
	if !e.hasBody {
		e.body, e.hasBody = sum, true
	}
	e.effects++
	n := e.effects
	drop := e.dropped < p.DropAfterEffect
	if drop {
		e.dropped++
	}
	sh.mu.Unlock()

	r.total.Add(1)
	eff := Effect{Key: key, Body: body, Headers: req.Header.Clone(), At: at}
	if r.opts.NoEffectLog {
		eff.Seq = int(r.seq.Add(1))
	} else {
		r.logMu.Lock()
		eff.Seq = len(r.log) + 1
		r.log = append(r.log, eff)
		r.logMu.Unlock()
	}
	if r.opts.OnEffect != nil {
		r.opts.OnEffect(eff)
	}

	resp, _ := json.Marshal(struct {
		Received string `json:"received"`
		Effect   int    `json:"effect"`
	}{key, n}) // cannot fail: a string and an int
	sh.mu.Lock()
	if e.stored == nil {
		e.stored = resp
	}
	e.inFlight = false
	sh.mu.Unlock()

	if drop {
		dropConnection(w)
		return
	}
	answer(w, http.StatusOK, resp)
}

func answer(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body) // a client that went away is its own problem
}

func answerError(w http.ResponseWriter, status int, msg string) {
	body, _ := json.Marshal(map[string]map[string]string{"error": {"message": msg}})
	answer(w, status, body)
}

// dropConnection closes the connection without writing a byte of the answer.
func dropConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not hijackable (HTTP/2): aborting the handler resets the stream instead.
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}

// verifySignature checks the Standard Webhooks headers: the signed content is
// "<webhook-id>.<webhook-timestamp>.<body>", and webhook-signature is a list of
// "v1,<base64 HMAC-SHA256>" separated by spaces, any of which may match any of secrets.
// The list is split at each single space, as the reference libraries split it (Go's and
// JavaScript's: strings.Split, split(" ")), not at any white space: a sender that
// separates signatures otherwise is refused here as it would be by them.
func verifySignature(secrets [][]byte, h http.Header, body []byte, now time.Time) error {
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return errors.New("missing webhook-id, webhook-timestamp or webhook-signature header")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("webhook-timestamp is not unix seconds")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > signatureTolerance || d < -signatureTolerance {
		return fmt.Errorf("webhook-timestamp is more than %s away from the receiver's clock", signatureTolerance)
	}
	for _, secret := range secrets {
		mac := hmac.New(sha256.New, secret)
		mac.Write([]byte(id + "." + ts + "."))
		mac.Write(body)
		want := []byte(base64.StdEncoding.EncodeToString(mac.Sum(nil)))
		for s := range strings.SplitSeq(sigs, " ") {
			version, sig, ok := strings.Cut(s, ",")
			if ok && version == "v1" && hmac.Equal([]byte(sig), want) {
				return nil
			}
		}
	}
	return errors.New("no webhook-signature matches the body")
}
