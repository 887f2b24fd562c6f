GO ?= go

.PHONY: demo test build bench fuzz

# The README's first command: a throwaway PostgreSQL, the relay, a local receiver.
demo:
	$(GO) run ./cmd/outboxd demo

# The README's test command, and what CI runs: vet, then every test with the race detector.
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 25m ./...

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/outboxd ./cmd/outboxd

bench:
	$(GO) test ./outbox -run '^$$' -bench Enqueue -benchtime 3000x

fuzz:
	$(GO) test ./outbox -run '^$$' -fuzz FuzzKey -fuzztime 30s
	$(GO) test ./outbox -run '^$$' -fuzz FuzzFingerprint -fuzztime 30s
