package webhook

import (
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
)

// TestSign_SpecVector reproduces the example published with the Standard Webhooks
// specification, which is what says a receiver's library will accept our signatures.
func TestSign_SpecVector(t *testing.T) {
	t.Parallel()
	key, err := parseSecret("Secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	require.NoError(t, err)
	require.Equal(t, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
		sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", []byte(`{"test": 2432232314}`)))
}

func TestReadExcerpt(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		in        string
		limit     int
		want      string
		truncated bool
	}{
		{"Short", "hello", 10, "hello", false},
		{"Exact", "hello", 5, "hello", false},
		{"Cut", "hello world", 5, "hello", true},
		{"CutInsideRune", "aé", 2, "a", true},
		{"Invalid", "a\xffb", 10, "a\uFFFDb", false},
		{"InvalidNoRoom", "a\xffb", 3, "a", true},
		{"Empty", "", 10, "", false},
		// A body that itself ends in half a character was read whole: nothing was left
		// out, and its last byte is invalid like any other.
		{"EndsInsideRune", "abc\xe2", 10, "abc\uFFFD", false},
		{"EndsInsideRuneAtLimit", "abc\xe2\x82", 5, "abc", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, truncated := readExcerpt(strings.NewReader(tt.in), tt.limit)
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.truncated, truncated)
			require.True(t, utf8.ValidString(got))
			require.LessOrEqual(t, len(got), tt.limit)
		})
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{" 120 ", 2 * time.Minute, true},
		{"-5", 0, false},
		{"1.5", 0, false},
		{"99999999999999", 0, false},
		{now.Add(time.Minute).Format(http.TimeFormat), time.Minute, true},
		{"Wednesday, 02-Jan-30 03:05:05 GMT", time.Minute, true}, // RFC 850, still allowed
		{"Wed Jan  2 03:05:05 2030", time.Minute, true},          // asctime
		{now.Add(-time.Minute).Format(http.TimeFormat), 0, true},
		{"tomorrow", 0, false},
		// Over a year is ignored, in either form, rather than taken as a plan.
		{"31536000", 365 * 24 * time.Hour, true},
		{"31536001", 0, false},
		{now.Add(365 * 24 * time.Hour).Format(http.TimeFormat), 365 * 24 * time.Hour, true},
		{now.Add(2 * 365 * 24 * time.Hour).Format(http.TimeFormat), 0, false},
		{"Fri, 31 Dec 9999 23:59:59 GMT", 0, false},
	}
	for _, tt := range tests {
		got, ok := connectors.ParseRetryAfter(tt.in, now)
		require.Equal(t, tt.ok, ok, "%q", tt.in)
		require.Equal(t, tt.want, got, "%q", tt.in)
	}
}

func TestNew_DefaultClient(t *testing.T) {
	t.Parallel()
	c, err := New(Config{URL: "http://127.0.0.1/"})
	require.NoError(t, err)
	require.Same(t, DefaultTransport(), c.transport)
	require.Equal(t, 10*time.Second, c.timeout)
	require.Equal(t, 1024, c.maxBody)
}
