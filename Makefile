GO ?= go

.PHONY: demo test build bench bench-enqueue fuzz

# The README's first command: a throwaway PostgreSQL, the relay, a local receiver.
demo:
	$(GO) run ./cmd/outboxd demo

# The README's test command, and what CI runs: vet, then every test with the race detector.
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 25m ./...

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
