package payment_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/payment"
)

// Stripe's metadata: "up to 50 keys, with key names up to 40 characters long and values
// up to 500 characters long". Stripe refuses more on every attempt, so such a payload is
// refused before the row is written (CheckPayload, which Enqueue runs) and before
// anything is sent; the limits themselves pass.
func TestDeliver_MetadataOverStripesLimitsIsRefusedUnsent(t *testing.T) {
	t.Parallel()
	url, take := recordingStripe(t, `{"object":"customer","id":"cus_1","livemode":false}`)
	c := newConnector(t, url)

	keys := func(n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `"k%d":"v"`, i)
		}
		return b.String()
	}
	for name, tc := range map[string]struct {
		metadata string
		ok       bool
	}{
		"50Keys":        {keys(50), true},
		"51Keys":        {keys(51), false},
		"40CharKey":     {fmt.Sprintf(`%q:"v"`, strings.Repeat("é", 40)), true},
		"41CharKey":     {fmt.Sprintf(`%q:"v"`, strings.Repeat("k", 41)), false},
		"500CharValue":  {fmt.Sprintf(`"k":%q`, strings.Repeat("é", 500)), true},
		"501CharValue":  {fmt.Sprintf(`"k":%q`, strings.Repeat("v", 501)), false},
		"NestedTooLong": {"", false},
	} {
		t.Run(name, func(t *testing.T) {
			payload := fmt.Sprintf(`{"operation":"customer.create","params":{"metadata":{%s}}}`, tc.metadata)
			if name == "NestedTooLong" {
				payload = fmt.Sprintf(`{"operation":"payment_intent.create","params":{"amount":2000,"currency":"usd",`+
					`"payment_method_data":{"type":"card","metadata":{"k":%q}}}}`, strings.Repeat("v", 501))
			}
			checkErr := payment.CheckPayload([]byte(payload))
			raw, err := c.Deliver(t.Context(), delivery("limits:"+name, payload))
			_, sent := take()
			if tc.ok {
				if checkErr != nil || err != nil || len(sent) == 0 {
					t.Fatalf("within the limits: CheckPayload %v, Deliver %s, %v, sent %d bytes; want accepted and sent", checkErr, raw, err, len(sent))
				}
				return
			}
			if checkErr == nil || !strings.Contains(checkErr.Error(), "metadata") {
				t.Errorf("CheckPayload accepted metadata Stripe refuses (err %v)", checkErr)
			}
			if len(sent) != 0 || !connectors.IsPermanent(err) {
				t.Errorf("sent body %q, result %s, err %v; want refused (permanent) with nothing sent", sent, raw, err)
			}
		})
	}
}
