package doctest

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// ShellInfo are the info strings of the fenced blocks that hold commands.
var ShellInfo = map[string]bool{"sh": true, "console": true, "bash": true, "shell": true}

// IllustrativePrefix starts a block's first line when a test cannot run
// the block; the reason follows it: `# illustrative: needs a Kubernetes
// cluster`. It is a shell comment, so the reader sees it too.
const IllustrativePrefix = "# illustrative:"

// ErrNoReason is returned for an illustrative marker with no reason.
var ErrNoReason = errors.New("doctest: illustrative marker without a reason")

// Block is one code block of a Markdown file.
type Block struct {
	File string // as given to Parse
	Line int    // 1-based line of the opening fence (or first indented line)
	Info string // the fenced block's info string's first word; "" when indented
	// Indented is true for a 4-space indented code block.
	Indented bool
	// Illustrative is the reason of the block's `# illustrative:` marker,
	// "" when the block is meant to run.
	Illustrative string
	// Lines are the block's lines, unindented.
	Lines []string
}

// Shell reports whether the block is one of the blocks whose commands
// must run: fenced with a shell info string.
func (b Block) Shell() bool { return !b.Indented && ShellInfo[b.Info] }

// Where names the block for messages: FILE:LINE.
func (b Block) Where() string { return fmt.Sprintf("%s:%d", b.File, b.Line) }

var fenceRE = regexp.MustCompile("^ {0,3}(```+|~~~+)[ \t]*([^ \t`]*)")

// Parse returns the code blocks of a Markdown document: fenced ones, and
// indented ones that start after a blank line outside a list (a line
// indented under a list item continues the item, not a code block).
func Parse(file, text string) ([]Block, error) {
	lines := strings.Split(text, "\n")
	var out []Block
	prevBlank, inList := true, false
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if m := fenceRE.FindStringSubmatch(l); m != nil {
			fence := m[1]
			b := Block{File: file, Line: i + 1, Info: m[2]}
			i++
			for ; i < len(lines) && !strings.HasPrefix(strings.TrimLeft(lines[i], " "), fence); i++ {
				b.Lines = append(b.Lines, lines[i])
			}
			if i == len(lines) {
				return nil, fmt.Errorf("%s:%d: fence never closed", file, b.Line)
			}
			if err := b.mark(); err != nil {
				return nil, err
			}
			out = append(out, b)
			prevBlank = false
			continue
		}
		trimmed := strings.TrimSpace(l)
		if listItem(trimmed) && !strings.HasPrefix(l, "    ") {
			inList = true
		} else if !strings.HasPrefix(l, " ") && trimmed != "" {
			inList = false
		}
		if strings.HasPrefix(l, "    ") && trimmed != "" && prevBlank && !inList {
			b := Block{File: file, Line: i + 1, Indented: true}
			for ; i < len(lines) && (strings.HasPrefix(lines[i], "    ") || strings.TrimSpace(lines[i]) == ""); i++ {
				b.Lines = append(b.Lines, strings.TrimPrefix(lines[i], "    "))
			}
			for len(b.Lines) > 0 && strings.TrimSpace(b.Lines[len(b.Lines)-1]) == "" {
				b.Lines = b.Lines[:len(b.Lines)-1]
			}
			if err := b.mark(); err != nil {
				return nil, err
			}
			out = append(out, b)
			i--
			prevBlank = false
			continue
		}
		prevBlank = trimmed == ""
	}
	return out, nil
}

var listRE = regexp.MustCompile(`^([-*+]|\d+[.)])\s`)

func listItem(trimmed string) bool { return listRE.MatchString(trimmed) }

// mark reads the block's illustrative marker from its first non-blank line.
func (b *Block) mark() error {
	for _, l := range b.Lines {
		t := strings.TrimSpace(l)
		if t == "" {
			continue
		}
		if r, ok := strings.CutPrefix(t, IllustrativePrefix); ok {
			if b.Illustrative = strings.TrimSpace(r); b.Illustrative == "" {
				return fmt.Errorf("%s: %w", b.Where(), ErrNoReason)
			}
		}
		return nil
	}
	return nil
}

// Command is one command of a block, continuation lines joined.
type Command struct {
	Line int    // 1-based line in the file
	Text string // as written, `\`-newline joined with a space
	// Exit is the exit status the block expects (from a `# exit N` line
	// before the command), 0 by default.
	Exit int
	// Stdout, when not nil, is the output the block expects (from a
	// `# stdout: TEXT` line before the command), spaces trimmed.
	Stdout *string
}

var (
	exitRE   = regexp.MustCompile(`^#\s*exit\s+(\d+)\s*$`)
	stdoutRE = regexp.MustCompile(`^#\s*stdout:(.*)$`)
)

// Commands returns the block's commands. In a console block, commands are
// the lines after a `$ ` prompt and the other lines are output; in the
// other blocks every line that is not blank or a comment is a command.
// A `# exit N` line sets the next command's expected exit status, and a
// `# stdout: TEXT` line its expected output.
func (b Block) Commands() ([]Command, error) {
	var out []Command
	exit := 0
	var stdout *string
	for i := 0; i < len(b.Lines); i++ {
		t := strings.TrimSpace(b.Lines[i])
		line := b.Line + 1 + i
		if m := exitRE.FindStringSubmatch(t); m != nil {
			exit, _ = strconv.Atoi(m[1])
			continue
		}
		if m := stdoutRE.FindStringSubmatch(t); m != nil {
			want := strings.TrimSpace(m[1])
			stdout = &want
			continue
		}
		if b.Info == "console" {
			c, ok := strings.CutPrefix(t, "$ ")
			if !ok {
				continue
			}
			t = c
		}
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		text := t
		for strings.HasSuffix(text, `\`) {
			i++
			if i == len(b.Lines) {
				return nil, fmt.Errorf("%s:%d: continuation at the end of the block", b.File, line)
			}
			text = strings.TrimSuffix(text, `\`) + " " + strings.TrimSpace(b.Lines[i])
		}
		out = append(out, Command{Line: line, Text: text, Exit: exit, Stdout: stdout})
		exit, stdout = 0, nil
	}
	return out, nil
}
