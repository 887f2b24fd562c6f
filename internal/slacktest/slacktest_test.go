package slacktest_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/slacktest"
)

// posted is what OnPostFunc saw of one post.
type posted struct {
	key      string
	effects  int  // the key's stored messages when the hook ran
	answered bool // whether the poster had its answer when the hook ran
}

// The hook runs once per stored message, with the key its metadata carries, after the
// message is stored and before the poster gets its answer; a post answered by a plan
// stores nothing and runs no hook. TS names the key's first message.
func TestOnPostFuncAndTS(t *testing.T) {
	t.Parallel()
	var (
		answered atomic.Bool
		fake     atomic.Pointer[slacktest.Server] // the hook's way to f, which the race detector sees
	)
	seen := make(chan posted, 4)
	f := slacktest.Start(t, slacktest.Options{OnPostFunc: func(key string) {
		seen <- posted{key: key, effects: fake.Load().Effects(key), answered: answered.Load()}
	}})
	fake.Store(f)
	post := func(key string) (ok bool, ts string) {
		t.Helper()
		form := url.Values{"token": {slacktest.Token}, "channel": {"C0TEST"}, "text": {"deployed"}}
		if key != "" {
			form.Set("metadata", `{"event_type":"`+slacktest.EventType+`","event_payload":{"`+slacktest.KeyField+`":"`+key+`"}}`)
		}
		answered.Store(false)
		resp, err := http.PostForm(f.APIBase()+"chat.postMessage", form)
		require.NoError(t, err)
		defer resp.Body.Close()
		answered.Store(true)
		var body struct {
			OK bool   `json:"ok"`
			TS string `json:"ts"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		return body.OK, body.TS
	}

	ok, first := post("k")
	require.True(t, ok)
	require.Equal(t, posted{key: "k", effects: 1}, <-seen)
	ok, _ = post("k")
	require.True(t, ok)
	require.Equal(t, posted{key: "k", effects: 2}, <-seen)
	ok, _ = post("")
	require.True(t, ok)
	require.Empty(t, (<-seen).key)
	f.Plan("k", slacktest.Plan{Error: "rate_limited"})
	ok, _ = post("k")
	require.False(t, ok)
	require.Empty(t, seen, "a post that stored nothing ran the hook")

	require.Equal(t, first, f.TS("k"))
	require.Equal(t, 2, f.Effects("k"))
	require.Equal(t, 3, f.Posts("k"))
	require.Empty(t, f.TS("other"))
}
