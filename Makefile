GO ?= go

.PHONY: demo test stripe-mock build bench bench-enqueue fuzz

# The README's first command: a throwaway PostgreSQL, the relay, a local receiver.
demo:
	$(GO) run ./cmd/outboxd demo

# The README's test command, and what CI runs: vet, then every test with the race detector.
test: stripe-mock
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 25m ./...

# stripe-mock, the Stripe API stand-in the payment connector's tests run on loopback,
# pinned to the release they were written against: installed with go install into
# $(go env GOPATH)/bin, where the tests look for it, unless it is there or on PATH.
STRIPE_MOCK = github.com/stripe/stripe-mock@v0.203.0
stripe-mock:
	@bin="$$($(GO) env GOPATH | cut -d: -f1)/bin"; \
	command -v stripe-mock >/dev/null 2>&1 || [ -x "$$bin/stripe-mock" ] || \
	{ echo "installing $(STRIPE_MOCK) into $$bin"; GOBIN="$$bin" $(GO) install $(STRIPE_MOCK); }

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/outboxd ./cmd/outboxd

# Relay throughput and commit-to-delivery latency (see the README's performance section).
bench:
	$(GO) build -o bin/outboxd ./cmd/outboxd
	bin/outboxd bench

# Enqueue overhead against a bare INSERT.
bench-enqueue:
	$(GO) test ./outbox -run '^$$' -bench Enqueue -benchtime 2s

fuzz:
	$(GO) test ./outbox -run '^$$' -fuzz FuzzKey -fuzztime 30s
	$(GO) test ./outbox -run '^$$' -fuzz FuzzFingerprint -fuzztime 30s
