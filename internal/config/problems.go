package config

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"
)

// Error is a configuration that cannot be used. Its message lists every problem found,
// one per line, each naming its variable.
type Error struct {
	// Problems holds one error per problem.
	Problems []error
	// Unknown lists the OUTBOX_ variables that nothing reads, as [Config.Unknown] does,
	// but for those a problem names already: a misspelt name is most often what a
	// problem is about (OUTBOX_WEBHOOK_CRM_ULR, for the OUTBOX_WEBHOOK_CRM_URL that
	// webhook:crm requires). [Load] sets it; serve warns about each with the problems.
	Unknown []string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("invalid configuration:")
	for _, p := range e.Problems {
		b.WriteString("\n- ")
		// One problem, one line, whatever the wrapped error says.
		b.WriteString(strings.ReplaceAll(p.Error(), "\n", " "))
	}
	return b.String()
}

// Unwrap returns the problems, for errors.Is and errors.As.
func (e *Error) Unwrap() []error { return e.Problems }

// Problems turns err into an [*Error] with one problem for each error that err joins
// (an env.AggregateError, errors.Join, an *Error), so a person sees every misconfigured
// variable at once. It returns nil for nil.
func Problems(err error) error {
	if err == nil {
		return nil
	}
	return &Error{Problems: flatten(err)}
}

// flatten returns the leaves of a tree of joined errors.
func flatten(err error) []error {
	m, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range m.Unwrap() {
		out = append(out, flatten(e)...)
	}
	return out
}

// problems collects what is wrong with a configuration. A variable gets at most one
// problem, so that a value that does not parse is not also reported as out of range.
type problems struct {
	errs     []error
	reported map[string]bool
}

// addf records a problem with variable name; "" records it without that check.
func (p *problems) addf(name, format string, args ...any) {
	if name != "" {
		if p.reported[name] {
			return
		}
		if p.reported == nil {
			p.reported = make(map[string]bool)
		}
		p.reported[name] = true
	}
	p.errs = append(p.errs, fmt.Errorf(format, args...))
}

// ok reports whether none of the variables has a problem yet.
func (p *problems) ok(names ...string) bool {
	for _, n := range names {
		if p.reported[n] {
			return false
		}
	}
	return true
}

func (p *problems) err() error {
	if len(p.errs) == 0 {
		return nil
	}
	return &Error{Problems: p.errs}
}

// parseEnv reads T from environment, with prefix before every variable name, and
// records its problems in p: env names only the Go field of a value that does not
// parse, so the problem is rewritten to name the variable and what it should hold.
func parseEnv[T any](environment map[string]string, prefix string, p *problems) T {
	v, err := env.ParseAsWithOptions[T](env.Options{Environment: environment, Prefix: prefix})
	if err == nil {
		return v
	}
	byField := make(map[string]variable)
	for _, f := range variablesOf(reflect.TypeFor[T](), prefix) {
		byField[f.field] = f
	}
	for _, e := range flatten(err) {
		var (
			parse env.ParseError
			unset env.VarIsNotSetError
			empty env.EmptyVarError
		)
		switch {
		case errors.As(e, &parse):
			if f, ok := byField[parse.Name]; ok {
				p.addf(f.Name, "%s", parseProblem(f.Name, environment[f.Name], parse))
			} else {
				p.addf("", "%w", e)
			}
		case errors.As(e, &unset):
			p.addf(unset.Key, "%s is required but not set", unset.Key)
		case errors.As(e, &empty):
			p.addf(empty.Key, "%s is required but empty", empty.Key)
		default:
			p.addf("", "%w", e)
		}
	}
	return v
}

// parseProblem says what a variable should hold. Only numbers and durations can fail
// to parse, and none of them is secret, so the value is shown.
func parseProblem(name, value string, e env.ParseError) string {
	var want string
	switch {
	case errors.Is(e.Err, strconv.ErrRange):
		// A number, which the words below would deny.
		return fmt.Sprintf("%s is out of range, got %q", name, value)
	case e.Type == reflect.TypeFor[time.Duration]() && durationSyntax.MatchString(value):
		// A duration longer than a time.Duration holds, such as a maximum age meant as
		// "never": time.ParseDuration says only "invalid duration", and the words below
		// would deny it is one.
		return fmt.Sprintf("%s is out of range (at most 2562047h), got %q", name, value)
	case e.Type == reflect.TypeFor[time.Duration]():
		want = "a duration such as 500ms, 30s or 1h30m"
	case e.Type.Kind() >= reflect.Int && e.Type.Kind() <= reflect.Uint64:
		want = "a whole number"
	case e.Type.Kind() == reflect.Float32 || e.Type.Kind() == reflect.Float64:
		want = "a number"
	default:
		return fmt.Sprintf("%s: %v", name, e.Err)
	}
	return fmt.Sprintf("%s must be %s, got %q", name, want, value)
}

// durationSyntax matches what time.ParseDuration reads, whatever the size: a sign, then
// numbers (decimal fractions too), each with a unit. What matches and still does not
// parse is too long for a time.Duration.
var durationSyntax = regexp.MustCompile(`^[-+]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+$`)

// variable is one environment variable read from a struct field's tags.
type variable struct {
	Variable
	field    string // the Go field's name, which env.ParseError reports
	required bool
}

// variablesOf lists the variables that env reads into a struct of type t, following
// env's rules: a tag of "-" skips the field, and a struct field without a name of its
// own is read with its envPrefix added.
func variablesOf(t reflect.Type, prefix string) []variable {
	var out []variable
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		key, opts, _ := strings.Cut(sf.Tag.Get("env"), ",")
		switch {
		case key == "-":
		case key == "" && sf.Type.Kind() == reflect.Struct:
			out = append(out, variablesOf(sf.Type, prefix+sf.Tag.Get("envPrefix"))...)
		case key != "":
			out = append(out, variable{
				Variable: Variable{
					Name:        prefix + key,
					Default:     sf.Tag.Get("envDefault"),
					Description: sf.Tag.Get("desc"),
				},
				field:    sf.Name,
				required: strings.Contains(","+opts+",", ",required,"),
			})
		}
	}
	return out
}
