package payment_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/payment"
)

// A row that creates a PaymentIntent. Its key is decided once, when the workflow decides
// to charge, so every attempt (and any replay) is the same Stripe request.
func Example() {
	c, err := payment.New(payment.Config{
		APIKey:  "sk_test_123",
		APIBase: "http://127.0.0.1:12111", // stripe-mock; leave empty for api.stripe.com
	})
	if err != nil {
		panic(err)
	}
	res, err := c.Deliver(context.Background(), connectors.Delivery{
		Key:     "order-42:charge",
		Attempt: 1,
		Payload: json.RawMessage(`{"operation": "payment_intent.create",
			"params": {"amount": 2000, "currency": "usd", "metadata": {"order": "42"}}}`),
	})
	fmt.Println(string(res), err)
}
