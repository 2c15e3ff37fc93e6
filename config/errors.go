package config

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Error is one configuration problem with the place it was found.
type Error struct {
	// File is the configuration file name, empty for a Config that was not
	// read from a file.
	File string
	// Line and Col locate the problem (1-based). Line is 0 when the
	// offending value was not written in the file (it is a default or was
	// set by a program); Col is 0 when unknown.
	Line, Col int
	// Key is the dotted key the problem is about, e.g. "board.vram" or
	// "vm[1].mode" (the second [[vm]] entry); empty for syntax errors.
	Key string
	// Msg describes the problem.
	Msg string
	// Err is the underlying cause, if any (a *toml.ParseError, a size or
	// duration parse error, ...).
	Err error
}

// Error formats the problem as "file:line:col: key: message", leaving out
// the parts that are unknown.
func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
			if e.Col > 0 {
				fmt.Fprintf(&b, ":%d", e.Col)
			}
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns the underlying cause.
func (e *Error) Unwrap() error { return e.Err }

// ErrorList is every problem found in a configuration, ordered by position
// (problems without a line come last). Parse, Load and Validate return one
// when there is at least one problem; use errors.As to get at it.
type ErrorList []*Error

// Error joins the problems, one per line.
func (l ErrorList) Error() string {
	s := make([]string, len(l))
	for i, e := range l {
		s[i] = e.Error()
	}
	return strings.Join(s, "\n")
}

// Unwrap returns the problems, for errors.Is and errors.As.
func (l ErrorList) Unwrap() []error {
	errs := make([]error, len(l))
	for i, e := range l {
		errs[i] = e
	}
	return errs
}

// sort orders the list by line and column; problems without a line go last.
func (l ErrorList) sort() {
	slices.SortStableFunc(l, func(a, b *Error) int {
		la, lb := a.Line, b.Line
		if la == 0 {
			la = int(^uint(0) >> 1)
		}
		if lb == 0 {
			lb = int(^uint(0) >> 1)
		}
		return cmp.Or(cmp.Compare(la, lb), cmp.Compare(a.Col, b.Col))
	})
}

// err returns the list as an error, or nil when it is empty.
func (l ErrorList) err() error {
	if len(l) == 0 {
		return nil
	}
	l.sort()
	return l
}
