package config

import "reflect"

// Variable is one environment variable that outboxd reads.
type Variable struct {
	// Name is the variable, such as OUTBOX_LEASE. A connector kind's variables are
	// named as the default instance reads them (OUTBOX_WEBHOOK_URL); a named instance
	// inserts its name after the kind (OUTBOX_WEBHOOK_CRM_URL).
	Name string
	// Default is the value used when the variable is unset or empty, or "" if none.
	// Durations are in Go syntax.
	Default string
	// Description says what the variable does.
	Description string
	// Kind is the connector kind whose instances read the variable ("webhook"), or ""
	// for the others.
	Kind string
}

// Variables lists every variable that [Load] reads, in a stable order: the global
// ones, then each connector kind's. It is read from the same struct tags that Load
// parses, so documentation built from it stays true.
func Variables() []Variable {
	var out []Variable
	for _, v := range variablesOf(reflect.TypeFor[Config](), "") {
		out = append(out, v.Variable)
	}
	for _, k := range kinds {
		for _, s := range k.sections {
			for _, v := range variablesOf(s.typ, s.prefix) {
				v.Kind = k.name
				out = append(out, v.Variable)
			}
		}
	}
	return out
}
