package payment_test

import (
	"fmt"
	"testing"

	"github.com/outboxd/outboxd/connectors"
)

// Stripe: metadata keys "can't include square brackets ([ ])". stripe-go escapes a form
// key but puts its brackets back, so such a key changes the structure Stripe parses:
// {"a][b": "x"} goes out as metadata[a][b]=x (metadata.a.b, a nested object), {"": "y"} as
// metadata[]=y (an array element), {"order]": "42"} as metadata[order]]=42, which a
// Rack-style parser reads as metadata.order. The row said something else. The
// connector refuses other values Stripe cannot take before sending; these it sends.
func TestDeliver_MetadataKeyWithBracketsIsRefusedUnsent(t *testing.T) {
	t.Parallel()
	url, take := recordingStripe(t, `{"object":"customer","id":"cus_1","livemode":false}`)
	c := newConnector(t, url)

	for i, key := range []string{"a][b", "order]", "x[y]", ""} {
		payload := fmt.Sprintf(`{"operation":"customer.create","params":{"metadata":{%q:"v"}}}`, key)
		raw, err := c.Deliver(t.Context(), delivery(fmt.Sprintf("brackets:%d", i), payload))
		_, sent := take()
		if len(sent) != 0 || !connectors.IsPermanent(err) {
			t.Errorf("metadata key %q: sent body %q, result %s, err %v; want refused (permanent) with nothing sent", key, sent, raw, err)
		}
	}
}
