// Package xlcfg reads xl domain configuration files (xl.cfg(5)), the files
// `xl create` takes: a series of KEY = VALUE settings, where a value is a
// string in single or double quotes, a number, or a list of values in
// brackets; settings end at a newline or a ';', lists may span lines, '#'
// starts a comment, and KEY += [list] appends to a list. gpuvm reads the
// domain's own settings (name, type) and its vGPU (the "gpuvm" key,
// vgpu.go) from the same file the operator gives xl. Every value keeps the
// line and column it was written at, so that a bad one is reported as
// file:line:col.
package xlcfg

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Kind is what a Value holds.
type Kind int

// Value kinds.
const (
	String Kind = iota
	Number
	List
)

func (k Kind) String() string {
	return [...]string{"string", "number", "list"}[k]
}

// Pos is where something was written.
type Pos struct{ Line, Col int }

// Value is one value of a setting.
type Value struct {
	Kind Kind
	Str  string  // String; Number: as written
	Num  float64 // Number
	List []Value // List
	Pos  Pos
}

// Setting is KEY = VALUE.
type Setting struct {
	Key   string
	Value Value
	Pos   Pos // of the key
}

// File is a parsed configuration: its settings by key, in file order (a
// key set twice keeps the last value, as xl does).
type File struct {
	Path     string
	settings map[string]Setting
	order    []string
}

// Error is a problem at a place in a file.
type Error struct {
	Path string
	Pos  Pos
	Key  string // the setting concerned, if any
	Msg  string
}

// Error formats the problem as file:line:col: key: message.
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s:%d:%d: ", e.Path, e.Pos.Line, e.Pos.Col)
	if e.Key != "" {
		b.WriteString(e.Key + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Load reads and parses the file at path.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("xl config: %w", err)
	}
	return Parse(data, path)
}

// Limits on what a configuration may hold (a hostile or broken file must
// not make the reader hold unbounded memory).
const (
	maxSize  = 1 << 20
	maxDepth = 8
)

// Parse parses data, naming it path in errors.
func Parse(data []byte, path string) (*File, error) {
	if len(data) > maxSize {
		return nil, &Error{Path: path, Pos: Pos{1, 1}, Msg: fmt.Sprintf("file of %d bytes: at most %d", len(data), maxSize)}
	}
	p := &parser{src: data, path: path, line: 1, col: 1}
	f := &File{Path: path, settings: map[string]Setting{}}
	for {
		p.skipSpace(true)
		if p.eof() {
			return f, nil
		}
		if p.peek() == ';' {
			p.next()
			continue
		}
		s, appendTo, err := p.setting()
		if err != nil {
			return nil, err
		}
		if appendTo {
			old, ok := f.settings[s.Key]
			switch {
			case !ok:
			case old.Value.Kind != List || s.Value.Kind != List:
				return nil, &Error{Path: path, Pos: s.Pos, Key: s.Key, Msg: "+= appends a list to a list"}
			default:
				s.Value.List = append(append([]Value(nil), old.Value.List...), s.Value.List...)
				s.Value.Pos = old.Value.Pos
			}
		}
		if _, ok := f.settings[s.Key]; !ok {
			f.order = append(f.order, s.Key)
		}
		f.settings[s.Key] = s
	}
}

// Keys returns the keys set, in the order first written.
func (f *File) Keys() []string { return append([]string(nil), f.order...) }

// Get returns the setting of key.
func (f *File) Get(key string) (Setting, bool) {
	s, ok := f.settings[key]
	return s, ok
}

// errorf is a problem with a setting's value.
func (f *File) errorf(s Setting, at Pos, format string, args ...any) error {
	return &Error{Path: f.Path, Pos: at, Key: s.Key, Msg: fmt.Sprintf(format, args...)}
}

// String returns key's value, which must be a string; ok is false when it
// is not set.
func (f *File) String(key string) (v string, ok bool, err error) {
	s, ok := f.settings[key]
	if !ok {
		return "", false, nil
	}
	if s.Value.Kind != String {
		return "", true, f.errorf(s, s.Value.Pos, "want a string, not a %v", s.Value.Kind)
	}
	return s.Value.Str, true, nil
}

// parser is a cursor over the file.
type parser struct {
	src       []byte
	path      string
	i         int
	line, col int
}

func (p *parser) eof() bool  { return p.i >= len(p.src) }
func (p *parser) peek() byte { return p.src[p.i] }
func (p *parser) pos() Pos   { return Pos{p.line, p.col} }

func (p *parser) next() byte {
	c := p.src[p.i]
	p.i++
	if c == '\n' {
		p.line, p.col = p.line+1, 1
	} else {
		p.col++
	}
	return c
}

func (p *parser) errorf(at Pos, format string, args ...any) error {
	return &Error{Path: p.path, Pos: at, Msg: fmt.Sprintf(format, args...)}
}

// skipSpace skips blanks and comments, and newlines too when nl is set.
func (p *parser) skipSpace(nl bool) {
	for !p.eof() {
		switch c := p.peek(); {
		case c == ' ' || c == '\t' || c == '\r':
			p.next()
		case c == '\n' && nl:
			p.next()
		case c == '#':
			for !p.eof() && p.peek() != '\n' {
				p.next()
			}
		default:
			return
		}
	}
}

func isKeyByte(c byte, first bool) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || !first && (c >= '0' && c <= '9' || c == '.' || c == '-')
}

// setting parses KEY = VALUE or KEY += VALUE and its terminator.
func (p *parser) setting() (s Setting, appendTo bool, err error) {
	s.Pos = p.pos()
	start := p.i
	for !p.eof() && isKeyByte(p.peek(), p.i == start) {
		p.next()
	}
	if p.i == start {
		return s, false, p.errorf(s.Pos, "expected a setting name, found %q", p.peek())
	}
	s.Key = string(p.src[start:p.i])
	p.skipSpace(false)
	if !p.eof() && p.peek() == '+' {
		p.next()
		appendTo = true
	}
	if p.eof() || p.peek() != '=' {
		return s, false, p.errorf(p.pos(), "%s: expected '=' after the setting name", s.Key)
	}
	p.next()
	p.skipSpace(false)
	if s.Value, err = p.value(0); err != nil {
		return s, false, err
	}
	p.skipSpace(false)
	if !p.eof() && p.peek() != '\n' && p.peek() != ';' {
		return s, false, p.errorf(p.pos(), "%s: unexpected %q after the value (one setting per line, or ';' between)", s.Key, p.peek())
	}
	return s, appendTo, nil
}

// value parses a string, a number or a list.
func (p *parser) value(depth int) (Value, error) {
	at := p.pos()
	if p.eof() || p.peek() == '\n' {
		return Value{}, p.errorf(at, "expected a value")
	}
	switch c := p.peek(); {
	case c == '"' || c == '\'':
		return p.str(at)
	case c == '[':
		if depth >= maxDepth {
			return Value{}, p.errorf(at, "lists nested deeper than %d", maxDepth)
		}
		return p.list(at, depth)
	case c == '-' || c == '+' || c >= '0' && c <= '9':
		start := p.i
		p.next()
		for !p.eof() && (p.peek() >= '0' && p.peek() <= '9' || p.peek() == '.' || p.peek() == 'x' || p.peek() == 'X' ||
			p.peek() >= 'a' && p.peek() <= 'f' || p.peek() >= 'A' && p.peek() <= 'F') {
			p.next()
		}
		text := string(p.src[start:p.i])
		n, err := strconv.ParseFloat(text, 64)
		if err != nil {
			iv, ierr := strconv.ParseInt(text, 0, 64)
			if ierr != nil {
				return Value{}, p.errorf(at, "bad number %q", text)
			}
			n = float64(iv)
		}
		return Value{Kind: Number, Str: text, Num: n, Pos: at}, nil
	default:
		return Value{}, p.errorf(at, "expected a value (a quoted string, a number or a [list]), found %q", c)
	}
}

// str parses a quoted string; xl knows the escapes \\, \", \' and \n.
func (p *parser) str(at Pos) (Value, error) {
	quote := p.next()
	var b strings.Builder
	for {
		if p.eof() || p.peek() == '\n' {
			return Value{}, p.errorf(at, "string not closed")
		}
		c := p.next()
		switch {
		case c == quote:
			return Value{Kind: String, Str: b.String(), Pos: at}, nil
		case c == '\\':
			if p.eof() {
				return Value{}, p.errorf(at, "string not closed")
			}
			e := p.next()
			switch e {
			case 'n':
				b.WriteByte('\n')
			case '\\', '"', '\'':
				b.WriteByte(e)
			default:
				return Value{}, p.errorf(Pos{p.line, p.col - 2}, "unknown escape \\%c", e)
			}
		default:
			b.WriteByte(c)
		}
	}
}

// list parses [ value, value, ... ] (a trailing comma allowed; newlines
// and comments anywhere inside).
func (p *parser) list(at Pos, depth int) (Value, error) {
	p.next()
	v := Value{Kind: List, Pos: at}
	for {
		p.skipSpace(true)
		if p.eof() {
			return Value{}, p.errorf(at, "list not closed")
		}
		if p.peek() == ']' {
			p.next()
			return v, nil
		}
		item, err := p.value(depth + 1)
		if err != nil {
			return Value{}, err
		}
		v.List = append(v.List, item)
		p.skipSpace(true)
		if p.eof() {
			return Value{}, p.errorf(at, "list not closed")
		}
		switch p.peek() {
		case ',':
			p.next()
		case ']':
		default:
			return Value{}, p.errorf(p.pos(), "expected ',' or ']' in the list, found %q", p.peek())
		}
	}
}
