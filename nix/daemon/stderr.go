package daemon

import (
	"fmt"
	"io"
	"regexp"
	"strings"
)

// Messages the daemon sends before an operation's reply ("stderr").
const (
	stderrNext          = 0x6f6c6d67 // a log line
	stderrRead          = 0x64617461 // the daemon wants data from the client
	stderrWrite         = 0x64617416 // data for the client's sink
	stderrLast          = 0x616c7473 // the reply follows
	stderrError         = 0x63787470 // the operation failed; no reply follows
	stderrStartActivity = 0x53545254
	stderrStopActivity  = 0x53544f50
	stderrResult        = 0x52534c54
)

// Activity and result types of structured log messages that the client
// looks at (Nix's ActivityType and ResultType).
const (
	ActivityBuild        = 105
	ResultBuildLogLine   = 101
	ResultPostBuildLine  = 107
	fieldInt, fieldText  = 0, 1
	maxFields            = 1 << 10
	maxReadRequestLength = 64 << 20
)

// Error is a failure the daemon reported (STDERR_ERROR). The connection
// stays usable after it.
type Error struct {
	Level   uint64   // Nix's verbosity of the error (0: error)
	Message string   // without terminal colour codes
	Traces  []string // the "… while" lines, outermost last
}

func (e *Error) Error() string {
	if len(e.Traces) == 0 {
		return e.Message
	}
	return e.Message + "\n" + strings.Join(e.Traces, "\n")
}

// Activity is a STDERR_START_ACTIVITY message.
type Activity struct {
	ID, Level, Type, Parent uint64
	Text                    string
	Fields                  []any // uint64 or string
}

// Result is a STDERR_RESULT message: a line of build log, a phase, progress.
type Result struct {
	Activity, Type uint64
	Fields         []any
}

// Logger receives the log messages of an operation; nil fields drop them.
type Logger struct {
	// Line gets plain log lines (STDERR_NEXT) and each line of build
	// output (results of type ResultBuildLogLine), without the newline.
	Line func(text string)
	// Start and Stop see activities, Result every result message.
	Start  func(Activity)
	Stop   func(id uint64)
	Result func(Result)
}

// message is one decoded stderr message.
type message struct {
	kind     uint64
	text     string // stderrNext, stderrWrite
	readLen  uint64 // stderrRead
	err      *Error
	activity Activity
	stopID   uint64
	result   Result
}

// readMessage decodes one stderr message.
func readMessage(r *reader) (message, error) {
	kind, err := r.u64()
	if err != nil {
		return message{}, err
	}
	m := message{kind: kind}
	switch kind {
	case stderrLast:
	case stderrNext, stderrWrite:
		m.text, err = r.string()
	case stderrRead:
		if m.readLen, err = r.u64(); err == nil && m.readLen > maxReadRequestLength {
			err = fmt.Errorf("%w: the daemon asks for %d bytes at once", ErrProtocol, m.readLen)
		}
	case stderrError:
		m.err, err = readError(r)
	case stderrStartActivity:
		a := &m.activity
		if a.ID, err = r.u64(); err != nil {
			break
		}
		if a.Level, err = r.u64(); err != nil {
			break
		}
		if a.Type, err = r.u64(); err != nil {
			break
		}
		if a.Text, err = r.string(); err != nil {
			break
		}
		if a.Fields, err = readFields(r); err != nil {
			break
		}
		a.Parent, err = r.u64()
	case stderrStopActivity:
		m.stopID, err = r.u64()
	case stderrResult:
		if m.result.Activity, err = r.u64(); err != nil {
			break
		}
		if m.result.Type, err = r.u64(); err != nil {
			break
		}
		m.result.Fields, err = readFields(r)
	default:
		err = fmt.Errorf("%w: unknown message type %#x", ErrProtocol, kind)
	}
	return m, err
}

// readError decodes the structured error of protocol 1.26 and later:
// "Error", level, a name (unused), the message, a position flag (always
// 0), and the traces, each a position flag and a line.
func readError(r *reader) (*Error, error) {
	typ, err := r.string()
	if err != nil {
		return nil, err
	}
	if typ != "Error" {
		return nil, fmt.Errorf("%w: error of type %.40q", ErrProtocol, typ)
	}
	e := &Error{}
	if e.Level, err = r.u64(); err != nil {
		return nil, err
	}
	if _, err = r.string(); err != nil { // the name
		return nil, err
	}
	msg, err := r.string()
	if err != nil {
		return nil, err
	}
	e.Message = plain(msg)
	if err := noPosition(r); err != nil {
		return nil, err
	}
	n, err := r.count()
	if err != nil {
		return nil, err
	}
	for range n {
		if err := noPosition(r); err != nil {
			return nil, err
		}
		trace, err := r.string()
		if err != nil {
			return nil, err
		}
		e.Traces = append(e.Traces, plain(trace))
	}
	return e, nil
}

// noPosition reads a position flag, which the daemon always sends as 0.
func noPosition(r *reader) error {
	has, err := r.u64()
	if err == nil && has != 0 {
		err = fmt.Errorf("%w: an error position (the protocol has none)", ErrProtocol)
	}
	return err
}

func readFields(r *reader) ([]any, error) {
	n, err := r.count()
	if err != nil {
		return nil, err
	}
	if n > maxFields {
		return nil, fmt.Errorf("%w: %d fields", ErrProtocol, n)
	}
	fields := make([]any, 0, n)
	for range n {
		typ, err := r.u64()
		if err != nil {
			return nil, err
		}
		switch typ {
		case fieldInt:
			v, err := r.u64()
			if err != nil {
				return nil, err
			}
			fields = append(fields, v)
		case fieldText:
			s, err := r.string()
			if err != nil {
				return nil, err
			}
			fields = append(fields, s)
		default:
			return nil, fmt.Errorf("%w: field of type %d", ErrProtocol, typ)
		}
	}
	return fields, nil
}

// ansiRE matches terminal colour sequences, which Nix puts around the
// names in its messages.
var ansiRE = regexp.MustCompile(`\x1b\[[0-9;]*[A-Za-z]`)

func plain(s string) string { return ansiRE.ReplaceAllString(s, "") }

// stderrIO is what an operation offers the daemon during its stderr loop.
type stderrIO struct {
	log    *Logger
	sink   io.Writer // STDERR_WRITE data
	source io.Reader // answers STDERR_READ
}

// processStderr runs the stderr loop until STDERR_LAST (nil: the reply
// follows) or STDERR_ERROR (*Error). Any other error means the connection
// is unusable.
func (c *conn) processStderr(s stderrIO) error {
	for {
		m, err := readMessage(&c.r)
		if err != nil {
			return err
		}
		switch m.kind {
		case stderrLast:
			return nil
		case stderrError:
			return m.err
		case stderrNext:
			if s.log != nil && s.log.Line != nil {
				s.log.Line(strings.TrimSuffix(plain(m.text), "\n"))
			}
		case stderrWrite:
			if s.sink == nil {
				return fmt.Errorf("%w: the daemon sent data but the operation has no sink", ErrProtocol)
			}
			if _, err := io.WriteString(s.sink, m.text); err != nil {
				return err
			}
		case stderrRead:
			if s.source == nil {
				return fmt.Errorf("%w: the daemon asked for data but the operation has none", ErrProtocol)
			}
			buf := make([]byte, m.readLen)
			n, err := io.ReadFull(s.source, buf)
			if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
				return err
			}
			if err := c.w.string(string(buf[:n])).flush(); err != nil {
				return err
			}
		case stderrStartActivity:
			if s.log != nil && s.log.Start != nil {
				s.log.Start(m.activity)
			}
		case stderrStopActivity:
			if s.log != nil && s.log.Stop != nil {
				s.log.Stop(m.stopID)
			}
		case stderrResult:
			if s.log == nil {
				break
			}
			if s.log.Result != nil {
				s.log.Result(m.result)
			}
			if t := m.result.Type; (t == ResultBuildLogLine || t == ResultPostBuildLine) && s.log.Line != nil && len(m.result.Fields) > 0 {
				if line, ok := m.result.Fields[0].(string); ok {
					s.log.Line(line)
				}
			}
		}
	}
}
