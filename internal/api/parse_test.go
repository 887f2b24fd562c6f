package api

import (
	"encoding/json"
	"errors"
	"testing"
)

func FuzzParseCreate(f *testing.F) {
	for _, s := range []string{
		`{"connector":"webhook","payload":{"a":1}}`,
		`{"connector":"payment","payload":{"operation":"refund.create","params":{}},"ordering_key":"o","not_before":"2030-01-01T00:00:00Z"}`,
		`{"connector":"webhook","payload":null}`,
		`{"extra":1}`, `[]`, `{`, `{} {}`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := parseCreate(body)
		if err != nil {
			if !errors.Is(err, errBadRequest) {
				t.Fatalf("error %v is not a bad request", err)
			}
			return
		}
		if len(req.Payload) > 0 && !json.Valid(req.Payload) {
			t.Fatalf("accepted invalid payload %q", req.Payload)
		}
	})
}
