package outbox_test

import (
	"fmt"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/outbox"
)

func ExampleKey() {
	// Derived from the work: the same run and step always give the same key.
	fmt.Println(outbox.Key("checkout", "cart-1842", "charge"))
	// Output: checkout/cart-1842/charge~wx5is6ziejotmxvgzqzwcio6yf
}

func TestKey(t *testing.T) {
	t.Parallel()
	require.Equal(t, outbox.Key("run-1", "step-2"), outbox.Key("run-1", "step-2"), "deterministic")
	require.NotEqual(t, outbox.Key("a", "bc"), outbox.Key("ab", "c"))
	require.NotEqual(t, outbox.Key("a/b"), outbox.Key("a", "b"))
	require.NotEqual(t, outbox.Key("a"), outbox.Key("a", ""))
	require.NotEqual(t, outbox.Key(), outbox.Key(""))
	require.NotEqual(t, outbox.Key("é"), outbox.Key("è"), "the readable part may be lossy; the hash is not")

	long := outbox.Key(strings.Repeat("x", 10_000), "ünïcödé\n\x00")
	require.LessOrEqual(t, len(long), 107)
	checkKey(t, long)
}

func checkKey(t *testing.T, k string) {
	t.Helper()
	require.NotEmpty(t, k)
	require.LessOrEqual(t, len(k), outbox.MaxKeyLength)
	for _, r := range k {
		require.True(t, r < 128 && unicode.IsPrint(r) && r != ' ', "printable ASCII: %q", k)
	}
}

func FuzzKey(f *testing.F) {
	f.Add("a", "bc", "ab", "c")
	f.Add("run/1", "", "run", "/1")
	f.Add("", "", "", "")
	f.Fuzz(func(t *testing.T, a, b, c, d string) {
		k1 := outbox.Key(a, b)
		checkKey(t, k1)
		require.Equal(t, k1, outbox.Key(a, b))
		if a != c || b != d {
			require.NotEqual(t, k1, outbox.Key(c, d), "different parts, different keys")
		}
		require.NotEqual(t, k1, outbox.Key(a+b), "two parts never equal their concatenation")
	})
}
