package config

import (
	"strconv"
	"strings"
)

// BurntSushi/toml keeps key positions to itself (and keys them without the
// index of the [[array]] entry they are in), so this file finds them again:
// a small scanner over an already-valid TOML document that records, for
// every key, table header and [[array]] entry, the line and column where it
// was written. Paths use the canonical form built by joinKey/indexKey, e.g.
// "board.vram", "vm[1].mode", "vm[1]" (the header of the second [[vm]]).

// position is where a key was written (1-based; col counts bytes).
type position struct {
	line, col int  // the key (or the '[' of a table header)
	valCol    int  // the value, or 0 for headers and implicit tables
	header    bool // written as a [table] or [[array]] header
}

// joinKey appends one key component to a path, quoting it when it is not a
// bare key.
func joinKey(prefix, seg string) string {
	q := seg
	if !isBareKey(seg) {
		q = strconv.Quote(seg)
	}
	if prefix == "" {
		return q
	}
	return prefix + "." + q
}

// indexKey appends an array index to a path.
func indexKey(prefix string, i int) string {
	return prefix + "[" + strconv.Itoa(i) + "]"
}

func isBareKey(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// scanner walks a TOML document that the toml package has already accepted.
// It is lenient: on anything unexpected it stops, keeping what it found.
type scanner struct {
	s         string
	i         int
	line      int
	lineStart int
	pos       map[string]position
	aot       map[string]int // [[array]] path → entries seen so far
}

// scanPositions returns the positions of all keys in data.
func scanPositions(data string) map[string]position {
	data = strings.TrimPrefix(data, "\xef\xbb\xbf")
	sc := &scanner{s: data, line: 1, pos: map[string]position{}, aot: map[string]int{}}
	sc.document()
	return sc.pos
}

func (sc *scanner) eof() bool        { return sc.i >= len(sc.s) }
func (sc *scanner) peek() byte       { return sc.s[sc.i] }
func (sc *scanner) col() int         { return sc.i - sc.lineStart + 1 }
func (sc *scanner) here() (int, int) { return sc.line, sc.col() }

func (sc *scanner) has(prefix string) bool { return strings.HasPrefix(sc.s[sc.i:], prefix) }

// advance moves over one byte, keeping track of lines.
func (sc *scanner) advance() {
	if sc.s[sc.i] == '\n' {
		sc.line++
		sc.lineStart = sc.i + 1
	}
	sc.i++
}

// record notes the first position of path.
func (sc *scanner) record(path string, p position) {
	if _, ok := sc.pos[path]; !ok {
		sc.pos[path] = p
	}
}

// skipSpace skips blanks; with newlines, also line ends and comments.
func (sc *scanner) skipSpace(newlines bool) {
	for !sc.eof() {
		switch c := sc.peek(); {
		case c == ' ' || c == '\t':
			sc.advance()
		case newlines && (c == '\n' || c == '\r'):
			sc.advance()
		case newlines && c == '#':
			sc.skipComment()
		default:
			return
		}
	}
}

func (sc *scanner) skipComment() {
	for !sc.eof() && sc.peek() != '\n' {
		sc.advance()
	}
}

func (sc *scanner) document() {
	table := "" // path of the current [table]
	for {
		sc.skipSpace(true)
		if sc.eof() {
			return
		}
		line, col := sc.here()
		if sc.peek() == '[' {
			array := sc.has("[[")
			sc.advance()
			if array {
				sc.advance()
			}
			segs, ok := sc.keyParts()
			if !ok {
				return
			}
			table = sc.header(segs, array, position{line: line, col: col, header: true})
			sc.skipSpace(false)
			for !sc.eof() && sc.peek() == ']' {
				sc.advance()
			}
			continue
		}
		if !sc.keyValue(table, line, col) {
			return
		}
	}
}

// header resolves a table header to its indexed path and records it.
func (sc *scanner) header(segs []string, array bool, p position) string {
	cur := ""
	for j, seg := range segs {
		cur = joinKey(cur, seg)
		last := j == len(segs)-1
		n, isArray := sc.aot[cur]
		switch {
		case last && array:
			sc.aot[cur] = n + 1
			sc.record(cur, p)
			cur = indexKey(cur, n)
		case isArray:
			cur = indexKey(cur, n-1)
		}
		sc.record(cur, p)
	}
	return cur
}

// keyValue scans "key = value" in table and records the key (and any
// implicit tables of a dotted key).
func (sc *scanner) keyValue(table string, line, col int) bool {
	segs, ok := sc.keyParts()
	if !ok {
		return false
	}
	sc.skipSpace(false)
	if sc.eof() || sc.peek() != '=' {
		return false
	}
	sc.advance()
	sc.skipSpace(false)
	path := table
	for j, seg := range segs {
		path = joinKey(path, seg)
		p := position{line: line, col: col}
		if j == len(segs)-1 {
			p.valCol = sc.col()
		}
		sc.record(path, p)
	}
	return sc.value(path)
}

// keyParts reads a possibly dotted key.
func (sc *scanner) keyParts() ([]string, bool) {
	var segs []string
	for {
		sc.skipSpace(false)
		if sc.eof() {
			return nil, false
		}
		var seg string
		switch sc.peek() {
		case '"':
			start := sc.i
			if !sc.basicString() {
				return nil, false
			}
			raw := sc.s[start:sc.i]
			if u, err := strconv.Unquote(raw); err == nil {
				seg = u
			} else {
				seg = raw[1 : len(raw)-1]
			}
		case '\'':
			start := sc.i + 1
			if !sc.literalString() {
				return nil, false
			}
			seg = sc.s[start : sc.i-1]
		default:
			start := sc.i
			for !sc.eof() && !strings.ContainsRune(" \t.=]\r\n#", rune(sc.peek())) {
				sc.advance()
			}
			seg = sc.s[start:sc.i]
			if seg == "" {
				return nil, false
			}
		}
		segs = append(segs, seg)
		sc.skipSpace(false)
		if sc.eof() || sc.peek() != '.' {
			return segs, true
		}
		sc.advance()
	}
}

// value skips one value; inline tables (also inside arrays) record their
// keys under path.
func (sc *scanner) value(path string) bool {
	if sc.eof() {
		return false
	}
	switch c := sc.peek(); {
	case c == '"':
		if sc.has(`"""`) {
			return sc.multiline(`"""`, true)
		}
		return sc.basicString()
	case c == '\'':
		if sc.has("'''") {
			return sc.multiline("'''", false)
		}
		return sc.literalString()
	case c == '[':
		sc.advance()
		for n := 0; ; n++ {
			sc.skipSpace(true)
			if sc.eof() {
				return false
			}
			if sc.peek() == ']' {
				sc.advance()
				return true
			}
			if !sc.value(indexKey(path, n)) {
				return false
			}
			sc.skipSpace(true)
			if !sc.eof() && sc.peek() == ',' {
				sc.advance()
			}
		}
	case c == '{':
		sc.advance()
		for {
			sc.skipSpace(true)
			if sc.eof() {
				return false
			}
			if sc.peek() == '}' {
				sc.advance()
				return true
			}
			line, col := sc.here()
			if !sc.keyValue(path, line, col) {
				return false
			}
			sc.skipSpace(true)
			if !sc.eof() && sc.peek() == ',' {
				sc.advance()
			}
		}
	default:
		// Number, boolean or date-time: up to a delimiter.
		start := sc.i
		for !sc.eof() && !strings.ContainsRune(",]}#\r\n", rune(sc.peek())) {
			sc.advance()
		}
		return sc.i > start
	}
}

// basicString skips a "..." string.
func (sc *scanner) basicString() bool {
	sc.advance()
	for !sc.eof() {
		switch sc.peek() {
		case '\\':
			sc.advance()
			if sc.eof() {
				return false
			}
		case '"':
			sc.advance()
			return true
		case '\n':
			return false
		}
		sc.advance()
	}
	return false
}

// literalString skips a '...' string.
func (sc *scanner) literalString() bool {
	sc.advance()
	for !sc.eof() {
		switch sc.peek() {
		case '\'':
			sc.advance()
			return true
		case '\n':
			return false
		}
		sc.advance()
	}
	return false
}

// multiline skips a """...""" or ”'...”' string; a closing delimiter may
// be followed by up to two more quotes that belong to the content.
func (sc *scanner) multiline(delim string, escapes bool) bool {
	for range 3 {
		sc.advance()
	}
	for !sc.eof() {
		if escapes && sc.peek() == '\\' {
			sc.advance()
			if !sc.eof() {
				sc.advance()
			}
			continue
		}
		if sc.has(delim) {
			for range 3 {
				sc.advance()
			}
			for extra := 0; extra < 2 && !sc.eof() && sc.peek() == delim[0]; extra++ {
				sc.advance()
			}
			return true
		}
		sc.advance()
	}
	return false
}
