// Package config reads outboxd's configuration from the environment. It is the only
// package that does; everything else takes plain structs.
//
// # Loading
//
// [Load] reads the whole configuration of `outboxd serve` from an environment given as
// os.Environ returns it, never from the process environment itself, so tests can run in
// parallel. Variables are parsed with caarlos0/env into the structs below, then checked
// together: the error lists every problem found, one per line ([Error]).
// [LoadDatabase] and [LoadLog] read the parts other commands need.
//
// # Variables
//
// The names are a public contract. [Variables] lists each one with its default and a
// description; they come from the struct tags, so the list cannot drift from what is
// parsed. Durations use Go syntax (30s, 5m, 1h30m).
//
// # Connector instances
//
// Each connector kind has a default instance, which exists when its key variable is
// set: OUTBOX_WEBHOOK_URL (webhook), OUTBOX_PAYMENT_API_KEY (payment), OUTBOX_SMTP_ADDR
// or OUTBOX_EMAIL_API_KEY (email, over SMTP or through Resend), or OUTBOX_SLACK_TOKEN
// (slack). OUTBOX_CONNECTORS names extra instances as kind:name, and each reads the
// default instance's variables with the upper-cased name inserted after the kind's
// prefix: webhook:crm reads OUTBOX_WEBHOOK_CRM_URL, payment:eu OUTBOX_PAYMENT_EU_API_KEY.
// The email kind has two prefixes, so email:support reads OUTBOX_SMTP_SUPPORT_ADDR and
// OUTBOX_EMAIL_SUPPORT_FROM. Every instance's timeout must be at least 1s shorter than
// OUTBOX_LEASE.
//
// # Secrets
//
// Values that must not be printed ([Secret], the password in the DSN, a token in a URL)
// are redacted by fmt and log/slog: [Config], [Database], [Webhook], [Payment], [Email]
// and [Slack] implement [slog.LogValuer] and String. encoding/json redacts a [Secret]
// but not those structs, whose DSN and URLs are plain strings: never encode them.
package config
