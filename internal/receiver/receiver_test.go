package receiver_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/receiver"
)

// testSecret is the Standard Webhooks specification's example secret.
const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

type testBundle struct {
	r      *receiver.Receiver
	client *http.Client
}

func setup(t *testing.T, opts receiver.Options) *testBundle {
	t.Helper()
	r, err := receiver.Start(opts)
	require.NoError(t, err)
	t.Cleanup(r.Close)
	// A transport of the test's own, so one test's dropped connections can't surface in
	// another's.
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &testBundle{r: r, client: &http.Client{Transport: tr}}
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (b *testBundle) post(t *testing.T, key, body string, header http.Header) (answer, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.r.URL(), bytes.NewBufferString(body))
	require.NoError(t, err)
	for k, v := range header {
		req.Header[k] = v
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	// Not replayable, so the transport never resends a request on its own after a drop.
	req.GetBody = nil
	resp, err := b.client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: data}, nil
}

func (b *testBundle) mustPost(t *testing.T, key, body string) answer {
	t.Helper()
	a, err := b.post(t, key, body, nil)
	require.NoError(t, err)
	return a
}

func effectBody(t *testing.T, a answer) (string, int) {
	t.Helper()
	var v struct {
		Received string `json:"received"`
		Effect   int    `json:"effect"`
	}
	require.NoError(t, json.Unmarshal(a.body, &v), "body %s", a.body)
	return v.Received, v.Effect
}

func TestReceiver_EnforcesKey(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})

	first := b.mustPost(t, "k1", `{"n":1}`)
	require.Equal(t, http.StatusOK, first.status)
	require.Equal(t, "application/json", first.header.Get("Content-Type"))
	got, n := effectBody(t, first)
	require.Equal(t, "k1", got)
	require.Equal(t, 1, n)
	require.Empty(t, first.header.Get("Idempotent-Replayed"))

	// A retry of the same request gets the stored answer and performs nothing.
	second := b.mustPost(t, "k1", `{"n":1}`)
	require.Equal(t, http.StatusOK, second.status)
	require.Equal(t, first.body, second.body)
	require.Equal(t, "true", second.header.Get("Idempotent-Replayed"))

	// The key reused for another request is refused, as Stripe does: it is not the
	// same operation, and answering it with the first one's result would hide that.
	other := b.mustPost(t, "k1", `{"n":2}`)
	require.Equal(t, http.StatusUnprocessableEntity, other.status)
	require.Contains(t, string(other.body), "different request")
	require.Empty(t, other.header.Get("Idempotent-Replayed"))

	require.Equal(t, 1, b.r.Effects("k1"))
	require.Equal(t, 3, b.r.Requests("k1"))
	require.Equal(t, 1, b.r.TotalEffects())
	require.Empty(t, b.r.DuplicateKeys())

	log := b.r.EffectLog()
	require.Len(t, log, 1)
	require.Equal(t, "k1", log[0].Key)
	require.JSONEq(t, `{"n":1}`, string(log[0].Body))
	require.Equal(t, "k1", log[0].Headers.Get("Idempotency-Key"))
	require.Equal(t, 1, log[0].Seq)
	require.False(t, log[0].At.IsZero())

	require.Equal(t, 0, b.r.Effects("unknown"))
	require.Equal(t, 0, b.r.Requests("unknown"))
}

func TestReceiver_RejectsBadRequests(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})

	a := b.mustPost(t, "", `{}`)
	require.Equal(t, http.StatusBadRequest, a.status)
	require.Contains(t, string(a.body), "Idempotency-Key")

	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, b.r.URL(), nil)
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "k")
	resp, err := b.client.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)

	a = b.mustPost(t, "big", string(bytes.Repeat([]byte("x"), 1<<20+1)))
	require.Equal(t, http.StatusRequestEntityTooLarge, a.status)

	require.Equal(t, 0, b.r.TotalEffects())
}

func TestReceiver_PlanFailFirst(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})

	b.r.Plan("k", receiver.Plan{FailFirst: 2, RetryAfter: "7"})
	for range 2 {
		a := b.mustPost(t, "k", `{}`)
		require.Equal(t, http.StatusServiceUnavailable, a.status)
		require.Equal(t, "7", a.header.Get("Retry-After"))
		require.Equal(t, 0, b.r.Effects("k"))
	}
	a := b.mustPost(t, "k", `{}`)
	require.Equal(t, http.StatusOK, a.status)
	require.Empty(t, a.header.Get("Retry-After"))
	require.Equal(t, 1, b.r.Effects("k"))
	require.Equal(t, 3, b.r.Requests("k"))

	b.r.Plan("k429", receiver.Plan{FailFirst: 1, FailStatus: http.StatusTooManyRequests})
	require.Equal(t, http.StatusTooManyRequests, b.mustPost(t, "k429", `{}`).status)
	require.Equal(t, http.StatusOK, b.mustPost(t, "k429", `{}`).status)
}

func TestReceiver_PlanPermanentStatus(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})

	b.r.Plan("k", receiver.Plan{PermanentStatus: http.StatusUnprocessableEntity})
	for range 3 {
		require.Equal(t, http.StatusUnprocessableEntity, b.mustPost(t, "k", `{}`).status)
	}
	require.Equal(t, 0, b.r.Effects("k"))
	require.Equal(t, 3, b.r.Requests("k"))
}

func TestReceiver_PlanDropAfterEffect(t *testing.T) {
	t.Parallel()

	t.Run("Once", func(t *testing.T) {
		t.Parallel()
		b := setup(t, receiver.Options{})
		b.r.Plan("k", receiver.Plan{DropAfterEffect: 1})

		_, err := b.post(t, "k", `{}`, nil)
		require.Error(t, err, "the connection closes without an answer")
		require.Equal(t, 1, b.r.Effects("k"), "the effect happened anyway")

		a := b.mustPost(t, "k", `{}`)
		require.Equal(t, http.StatusOK, a.status)
		require.Equal(t, "true", a.header.Get("Idempotent-Replayed"))
		_, n := effectBody(t, a)
		require.Equal(t, 1, n)
		require.Equal(t, 1, b.r.Effects("k"))
		require.Equal(t, 2, b.r.Requests("k"))
	})

	t.Run("ReplaysDroppedToo", func(t *testing.T) {
		t.Parallel()
		b := setup(t, receiver.Options{})
		b.r.Plan("k", receiver.Plan{DropAfterEffect: 2})

		for range 2 {
			_, err := b.post(t, "k", `{}`, nil)
			require.Error(t, err)
		}
		require.Equal(t, http.StatusOK, b.mustPost(t, "k", `{}`).status)
		require.Equal(t, 1, b.r.Effects("k"))
	})

	t.Run("OnReusedConnection", func(t *testing.T) {
		t.Parallel()
		b := setup(t, receiver.Options{})
		require.Equal(t, http.StatusOK, b.mustPost(t, "warm", `{}`).status)
		b.r.Plan("k", receiver.Plan{DropAfterEffect: 1})

		_, err := b.post(t, "k", `{}`, nil)
		require.Error(t, err)
		require.Equal(t, 1, b.r.Requests("k"))
	})
}

func TestReceiver_ConcurrentSameKeyGets409(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	release := make(chan struct{})
	b := setup(t, receiver.Options{OnEffect: func(e receiver.Effect) {
		if e.Key == "held" {
			close(entered)
			<-release
		}
	}})

	var (
		wg    sync.WaitGroup
		first answer
		ferr  error
	)
	wg.Go(func() { first, ferr = b.post(t, "held", `{}`, nil) })
	<-entered

	a := b.mustPost(t, "held", `{}`)
	require.Equal(t, http.StatusConflict, a.status)
	a = b.mustPost(t, "held", `{"other":true}`)
	require.Equal(t, http.StatusUnprocessableEntity, a.status, "another request under the key in flight")
	require.Equal(t, http.StatusOK, b.mustPost(t, "other", `{}`).status, "other keys are not blocked")

	close(release)
	wg.Wait()
	require.NoError(t, ferr)
	require.Equal(t, http.StatusOK, first.status)
	require.Equal(t, http.StatusOK, b.mustPost(t, "held", `{}`).status)
	require.Equal(t, 1, b.r.Effects("held"))
	require.Equal(t, 4, b.r.Requests("held"))
}

func TestReceiver_ConcurrentHammer(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})

	const keys, workers = 20, 16
	var (
		wg sync.WaitGroup
		ok atomic.Int64
	)
	for w := range workers {
		wg.Go(func() {
			for k := range keys {
				a, err := b.post(t, fmt.Sprintf("key-%d", (k+w)%keys), `{}`, nil)
				if err == nil && a.status == http.StatusOK {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()

	require.Positive(t, ok.Load())
	for k := range keys {
		require.Equal(t, 1, b.r.Effects(fmt.Sprintf("key-%d", k)))
	}
	require.Equal(t, keys, b.r.TotalEffects())
	require.Empty(t, b.r.DuplicateKeys())

	log := b.r.EffectLog()
	require.Len(t, log, keys)
	for i, e := range log {
		require.Equal(t, i+1, e.Seq)
	}
}

func TestReceiver_IgnoreKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{IgnoreKeys: true})

	b.r.Plan("k", receiver.Plan{DropAfterEffect: 1})
	_, err := b.post(t, "k", `{}`, nil)
	require.Error(t, err)
	a := b.mustPost(t, "k", `{}`)
	require.Equal(t, http.StatusOK, a.status)
	_, n := effectBody(t, a)
	require.Equal(t, 2, n)
	require.Equal(t, 2, b.r.Effects("k"))
	require.Equal(t, []string{"k"}, b.r.DuplicateKeys())

	a = b.mustPost(t, "", `{}`)
	require.Equal(t, http.StatusBadRequest, a.status, "the key is still required")
}

func TestReceiver_FailRate(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{FailRate: 1, Seed: 42})

	for i := range 5 {
		require.Equal(t, http.StatusServiceUnavailable, b.mustPost(t, strconv.Itoa(i), `{}`).status)
	}
	require.Equal(t, 0, b.r.TotalEffects())

	_, err := receiver.Start(receiver.Options{FailRate: 1.5})
	require.ErrorContains(t, err, "FailRate")
}

func TestReceiver_NoEffectLog(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		seqs []int
	)
	b := setup(t, receiver.Options{NoEffectLog: true, OnEffect: func(e receiver.Effect) {
		mu.Lock()
		defer mu.Unlock()
		seqs = append(seqs, e.Seq)
	}})

	for i := range 3 {
		require.Equal(t, http.StatusOK, b.mustPost(t, strconv.Itoa(i), `{}`).status)
	}
	require.Equal(t, 3, b.r.TotalEffects())
	require.Empty(t, b.r.EffectLog())
	require.Equal(t, []int{1, 2, 3}, seqs)
}

func sign(t *testing.T, secret, id string, ts int64, body string) http.Header {
	t.Helper()
	key, err := base64.StdEncoding.DecodeString(secret[len("whsec_"):])
	require.NoError(t, err)
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%d.%s", id, ts, body)
	h := http.Header{}
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	h.Set("webhook-signature", "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	return h
}

func TestReceiver_Signature(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{Secret: testSecret})
	now := time.Now().Unix()
	body := `{"a":1}`

	a, err := b.post(t, "ok", body, sign(t, testSecret, "ok", now, body))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, a.status)

	// Several signatures, one of them right (a sender rotating its secret).
	h := sign(t, testSecret, "multi", now, body)
	h.Set("webhook-signature", "v1,bm9wZQ== v2,xyz "+h.Get("webhook-signature"))
	a, err = b.post(t, "multi", body, h)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, a.status)

	other := "whsec_" + base64.StdEncoding.EncodeToString([]byte("another secret entirely"))
	for name, h := range map[string]http.Header{
		"WrongSecret": sign(t, other, "bad", now, body),
		"OtherBody":   sign(t, testSecret, "bad", now, `{"a":2}`),
		"TooOld":      sign(t, testSecret, "bad", now-int64((6*time.Minute).Seconds()), body),
		"Missing":     {},
	} {
		a, err := b.post(t, "bad", body, h)
		require.NoError(t, err, name)
		require.Equal(t, http.StatusUnauthorized, a.status, name)
	}
	require.Equal(t, 0, b.r.Effects("bad"))
	require.Equal(t, 0, b.r.Requests("bad"), "unauthenticated requests don't reach the key")

	_, err = receiver.Start(receiver.Options{Secret: "whsec_!!!"})
	require.ErrorContains(t, err, "Secret")
}

// A receiver given several secrets, as one that holds the old and the new secret while
// the sender's is rotated, accepts a signature made with any of them; and it splits the
// header's list at single spaces, as the Standard Webhooks reference libraries do.
func TestReceiver_SeveralSecrets(t *testing.T) {
	t.Parallel()
	old := "whsec_" + base64.StdEncoding.EncodeToString([]byte("the old secret, being retired"))
	b := setup(t, receiver.Options{Secret: old, Secrets: []string{testSecret}})
	now := time.Now().Unix()
	body := `{"a":1}`

	for _, secret := range []string{old, testSecret} {
		a, err := b.post(t, secret, body, sign(t, secret, secret, now, body))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, a.status)
	}
	other := "whsec_" + base64.StdEncoding.EncodeToString([]byte("another secret entirely"))
	a, err := b.post(t, "bad", body, sign(t, other, "bad", now, body))
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, a.status)

	// The right signature after a tab, not a space: the reference libraries see one
	// malformed entry, and so does the receiver.
	h := sign(t, testSecret, "tab", now, body)
	h.Set("webhook-signature", "v1,bm9wZQ==\t"+h.Get("webhook-signature"))
	a, err = b.post(t, "tab", body, h)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, a.status)

	_, err = receiver.Start(receiver.Options{Secrets: []string{testSecret, "whsec_!!!"}})
	require.ErrorContains(t, err, "Secrets[1]")
}

func TestReceiver_Close(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	require.Equal(t, http.StatusOK, b.mustPost(t, "k", `{}`).status)
	b.r.Close()
	b.r.Close()
	b.client.CloseIdleConnections()
	_, err := b.post(t, "k2", `{}`, nil)
	require.Error(t, err)
}

func BenchmarkReceiver(b *testing.B) {
	r, err := receiver.Start(receiver.Options{NoEffectLog: true})
	require.NoError(b, err)
	defer r.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: 512}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var n atomic.Int64

	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest(http.MethodPost, r.URL(), bytes.NewBufferString(`{"n":1}`))
			req.Header.Set("Idempotency-Key", strconv.FormatInt(n.Add(1), 10))
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
	})
}
