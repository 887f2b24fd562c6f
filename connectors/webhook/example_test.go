package webhook_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/receiver"
)

func Example() {
	// A receiver that honours Idempotency-Key and checks signatures.
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	r, err := receiver.Start(receiver.Options{Secret: secret})
	if err != nil {
		panic(err)
	}
	defer r.Close()

	c, err := webhook.New(webhook.Config{
		URL:       r.URL(),
		Secret:    secret,
		Guarantee: connectors.Enforced, // this receiver dedupes on the key
	})
	if err != nil {
		panic(err)
	}

	d := connectors.Delivery{
		Key:     "order-42:notify-crm",
		Attempt: 1,
		Payload: json.RawMessage(`{"order":42,"state":"paid"}`),
	}
	res, err := c.Deliver(context.Background(), d)
	fmt.Println(string(res), err)

	// A retry with the same key gets the stored answer; the receiver acted once.
	d.Attempt = 2
	res, err = c.Deliver(context.Background(), d)
	fmt.Println(string(res), err)
	fmt.Println("effects:", r.Effects(d.Key))
	// Output:
	// {"status":200,"body":"{\"received\":\"order-42:notify-crm\",\"effect\":1}"} <nil>
	// {"status":200,"body":"{\"received\":\"order-42:notify-crm\",\"effect\":1}"} <nil>
	// effects: 1
}

// A secret is rotated by signing with the old and the new one for a while: a receiver
// that holds either accepts the request, so receivers can move to the new secret one at
// a time, and the old one is dropped once none holds it any more.
func ExampleConfig_secrets() {
	const (
		oldSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		newSecret = "whsec_dGhlIG5ldyBzZWNyZXQsIHJlcGxhY2luZyBpdA=="
	)
	for _, receiverSecret := range []string{oldSecret, newSecret} {
		r, err := receiver.Start(receiver.Options{Secret: receiverSecret})
		if err != nil {
			panic(err)
		}
		c, err := webhook.New(webhook.Config{
			URL:     r.URL(),
			Secrets: []string{oldSecret, newSecret}, // or Secret: oldSecret + " " + newSecret
		})
		if err != nil {
			panic(err)
		}
		_, err = c.Deliver(context.Background(), connectors.Delivery{
			Key:     "order-42:notify-crm",
			Attempt: 1,
			Payload: json.RawMessage(`{"order":42,"state":"paid"}`),
		})
		fmt.Println(err, r.Effects("order-42:notify-crm"))
		r.Close()
	}
	// Output:
	// <nil> 1
	// <nil> 1
}
