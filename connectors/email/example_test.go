package email_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/email"
)

func Example() {
	// A real SMTP server on loopback (go-smtp), as the tests use.
	srv, stop, err := listen(serverOptions{})
	if err != nil {
		panic(err)
	}
	defer stop()

	c, err := email.New(email.Config{
		Addr: srv.addr, // host:port, such as "smtp.example.com:587"
		From: "Shop <orders@shop.example>",
	})
	if err != nil {
		panic(err)
	}

	d := connectors.Delivery{
		Key:     "order-42:shipped",
		Attempt: 1,
		Payload: json.RawMessage(`{"to":"ann@example.com","subject":"Shipped","text":"Your order is on its way."}`),
	}
	res, err := c.Deliver(context.Background(), d)
	fmt.Println(string(res), err)
	// Output:
	// {"message_id":"<e95edb5abac95c230e21dcb826a1ca4b@shop.example>","accepted":["ann@example.com"],"server_reply":"250 2.0.0 OK: queued"} <nil>
}
