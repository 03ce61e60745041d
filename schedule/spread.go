package schedule

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Hashed spread: "H" in a cron or crontab field stands for one value of the
// field's range chosen by a hash of the entry's name, as Jenkins' H does,
// so that a thousand entries written "H * * * *" fire at different minutes,
// and each at the same minute on every replica, after every restart and in
// every release. H is resolved to plain values when an entry is read
// (ParseCronFor, ResolveCrontabField): the schedule that results is an
// ordinary cron or crontab, so next-fire has one owner.

// SpreadHash is the hash behind H for the entry called name and the field
// called field ("second", "minute", "hour", "day_of_month",
// "month_of_year", "day_of_week"): 32-bit FNV-1a over the UTF-8 bytes of
// name, a zero byte and field, finished with MurmurHash3's fmix32, so that
// every bit of the name moves every bit of the result and the fields of one
// name do not move together. It is part of beatd's compatibility promise:
// changing it moves every hashed entry's slots (TestSpreadHashGolden pins
// it).
func SpreadHash(name, field string) uint32 {
	const offset32, prime32 = 2166136261, 16777619
	h := uint32(offset32)
	for i := 0; i < len(name); i++ {
		h ^= uint32(name[i])
		h *= prime32
	}
	h *= prime32 // the zero byte: h ^= 0 leaves h
	for i := 0; i < len(field); i++ {
		h ^= uint32(field[i])
		h *= prime32
	}
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// spreadPick maps h onto [0, n) by its high bits (Lemire's multiply-shift),
// which, unlike h % n, uses all of the hash evenly.
func spreadPick(h uint32, n int) int {
	return int(uint64(h) * uint64(n) >> 32)
}

// spreadField is one field's range for H: [lo, hi], and the narrower range
// a bare H picks from (day of month: 1-28, so that it fires every month,
// as Jenkins does).
type spreadField struct {
	key          string
	lo, hi       int
	bareLo, bare int
}

var (
	spreadSecond = spreadField{"second", 0, 59, 0, 59}
	spreadMinute = spreadField{"minute", 0, 59, 0, 59}
	spreadHour   = spreadField{"hour", 0, 23, 0, 23}
	spreadDom    = spreadField{"day_of_month", 1, 31, 1, 28}
	spreadMonth  = spreadField{"month_of_year", 1, 12, 1, 12}
	spreadDow    = spreadField{"day_of_week", 0, 6, 0, 6}
)

var reSpread = regexp.MustCompile(`^H(?:\((\d{1,3})-(\d{1,3})\))?(?:/(\d{1,3}))?$`)

// resolveSpread rewrites each comma part of one field that starts with H
// into plain values for the entry called name: "H" is one value, "H/n"
// every n-th value from a hashed start below n, "H(a-b)" one value in
// a-b, "H(a-b)/n" every n-th in a-b from a hashed start. Other parts are
// kept as written. It reports whether any part was hashed.
func resolveSpread(fd spreadField, spec, name string) (string, bool, error) {
	if !strings.Contains(spec, "H") {
		return spec, false, nil
	}
	parts := strings.Split(spec, ",")
	hashed := false
	for i, part := range parts {
		if !strings.HasPrefix(part, "H") {
			continue
		}
		out, err := resolveSpreadPart(fd, part, name)
		if err != nil {
			return "", false, fmt.Errorf("%s %q: %w", fd.key, part, err)
		}
		parts[i], hashed = out, true
	}
	return strings.Join(parts, ","), hashed, nil
}

func resolveSpreadPart(fd spreadField, part, name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("H needs the entry's name to hash")
	}
	m := reSpread.FindStringSubmatch(part)
	if m == nil {
		return "", fmt.Errorf("want H, H/STEP, H(LO-HI) or H(LO-HI)/STEP")
	}
	lo, hi := fd.bareLo, fd.bare
	if m[1] != "" {
		lo, _ = strconv.Atoi(m[1])
		hi, _ = strconv.Atoi(m[2])
		if lo < fd.lo || hi > fd.hi {
			return "", fmt.Errorf("range %d-%d is outside the field's %d-%d", lo, hi, fd.lo, fd.hi)
		}
		if lo > hi {
			return "", fmt.Errorf("range %d-%d is empty: H does not wrap, write LO-HI with LO <= HI", lo, hi)
		}
	} else if m[3] != "" {
		// H/n steps through the whole field, as */n does.
		lo, hi = fd.lo, fd.hi
	}
	h := SpreadHash(name, fd.key)
	if m[3] == "" {
		return strconv.Itoa(lo + spreadPick(h, hi-lo+1)), nil
	}
	step, _ := strconv.Atoi(m[3])
	if step < 1 {
		return "", fmt.Errorf("step must be at least 1, got %d", step)
	}
	if step > hi-lo+1 {
		return "", fmt.Errorf("step %d is larger than the range %d-%d, so it would fire once: write H(%d-%d) for that", step, lo, hi, lo, hi)
	}
	start := lo + spreadPick(h, step)
	return fmt.Sprintf("%d-%d/%d", start, hi, step), nil
}

// ResolveCronSpread resolves H in a five- or six-field cron expression for
// the entry called name, and reports whether there was any. An expression
// of another shape is returned as it is, for the cron parser to judge.
func ResolveCronSpread(expr, name string) (string, bool, error) {
	fields := strings.Fields(expr)
	var kinds []spreadField
	switch len(fields) {
	case 5:
		kinds = []spreadField{spreadMinute, spreadHour, spreadDom, spreadMonth, spreadDow}
	case 6:
		kinds = []spreadField{spreadSecond, spreadMinute, spreadHour, spreadDom, spreadMonth, spreadDow}
	default:
		return expr, false, nil
	}
	hashedAny := false
	for i, f := range fields {
		out, hashed, err := resolveSpread(kinds[i], f, name)
		if err != nil {
			return "", false, fmt.Errorf("cron %q: %w", expr, err)
		}
		fields[i], hashedAny = out, hashedAny || hashed
	}
	if !hashedAny {
		return expr, false, nil
	}
	return strings.Join(fields, " "), true, nil
}

var crontabSpread = [...]spreadField{
	Minute:      spreadMinute,
	Hour:        spreadHour,
	DayOfWeek:   spreadDow,
	DayOfMonth:  spreadDom,
	MonthOfYear: spreadMonth,
}

// ResolveCrontabField resolves H in one crontab field for the entry called
// name; a field and a cron field of the same kind resolve alike.
func ResolveCrontabField(f CrontabField, spec, name string) (string, bool, error) {
	out, hashed, err := resolveSpread(crontabSpread[f], spec, name)
	if err != nil {
		return "", false, fmt.Errorf("crontab %w", err)
	}
	return out, hashed, nil
}

// Spread returns what the H of a schedule resolved to: a cron's
// expression ("17 * * * *"), a crontab's fields as its String writes them;
// false when the schedule has no H.
func Spread(s Schedule) (string, bool) {
	s = Base(s)
	if nb, ok := s.(*NotBefore); ok {
		s = Base(nb.Schedule)
	}
	switch w := s.(type) {
	case *Cron:
		if w.written != "" {
			return w.expr, true
		}
	case *Crontab:
		if w.spread {
			return w.String(), true
		}
	}
	return "", false
}
