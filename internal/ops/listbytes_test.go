package ops_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
)

// A page holds at most a few megabytes of payloads: an API token's GET of 1,000 rows
// of a megabyte each (plain SQL writes any size) was read and encoded whole, a gigabyte
// of the server's memory for one request. A page of large rows has fewer rows than its
// limit, always one, and its Next goes on to every row, once.
func TestListBoundsAPageOfLargeRows(t *testing.T) {
	t.Parallel()
	large := strings.Repeat("x", 5<<20)
	for name, big := range map[string]row{
		"payloads": {Payload: fmt.Sprintf(`{"s": %q}`, large)},
		// Headers count too: plain SQL (or Enqueue) writes them as large as payloads, and
		// a page answers them whole; they did not count, and a page of three rows of 5 MiB
		// headers was 15 MiB, of 1,000 such rows 5 GiB.
		"headers": {Headers: fmt.Sprintf(`{"x-trace": %q}`, large)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.DB(t)
			for _, k := range []string{"big-1", "big-2", "big-3"} {
				r := big
				r.Key = k
				insertRow(t, pool, r)
			}
			insertRow(t, pool, row{Key: "small", Age: time.Second})

			var pages [][]string
			f := ops.Filter{Limit: 10}
			for range 10 {
				page, err := ops.List(t.Context(), pool, f)
				require.NoError(t, err)
				var keys []string
				for _, in := range page.Intents {
					keys = append(keys, in.Key)
				}
				pages = append(pages, keys)
				if page.Next == "" {
					break
				}
				f.After = page.Next
			}
			// Newest first (id descending at one created_at): one large row a page, the small
			// one beside the last.
			require.Equal(t, [][]string{{"big-3"}, {"big-2"}, {"big-1", "small"}}, pages)
		})
	}
}
