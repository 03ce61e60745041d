package schedule

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// SolarEvents are the events of Celery's solar schedule, in the order of a
// day.
var SolarEvents = []string{
	"dawn_astronomical", "dawn_nautical", "dawn_civil", "sunrise", "solar_noon",
	"sunset", "dusk_civil", "dusk_nautical", "dusk_astronomical",
}

// solarEvent is how Celery 5.2.6 computes one event with ephem: the
// horizon, whether the Sun's centre (rather than its upper limb) crosses
// it, and which crossing counts. beatd differs in one place: Celery gives
// dusk_astronomical the horizon +18° (a typo for -18°, its dawn twin);
// beatd uses -18°.
type solarEvent struct {
	horizonDeg float64
	center     bool
	kind       int // riseEvent, setEvent or transitEvent
}

const (
	riseEvent = iota
	setEvent
	transitEvent
)

var solarEventTable = map[string]solarEvent{
	"dawn_astronomical": {-18, true, riseEvent},
	"dawn_nautical":     {-12, true, riseEvent},
	"dawn_civil":        {-6, true, riseEvent},
	"sunrise":           {-34.0 / 60, false, riseEvent},
	"solar_noon":        {0, false, transitEvent},
	"sunset":            {-34.0 / 60, false, setEvent},
	"dusk_civil":        {-6, true, setEvent},
	"dusk_nautical":     {-12, true, setEvent},
	"dusk_astronomical": {-18, true, setEvent},
}

// Solar fires at a solar event seen from a place, as Celery's solar
// schedule does: no atmospheric refraction (Celery sets the pressure to 0),
// sea level, the Sun's apparent topocentric position.
//
// Where the event does not happen on a day (polar day or night, or a Sun
// that never gets 18° below the horizon in a summer night), Celery 5.2.6
// raises a TypeError in its fallback and celery beat dies; beatd fires on
// the next day on which the event occurs.
type Solar struct {
	Event    string
	Lat, Lon float64 // degrees, north and east positive
	ev       solarEvent
}

var _ Schedule = (*Solar)(nil)

// NewSolar validates an event and a place, with Celery's ranges.
func NewSolar(event string, lat, lon float64) (*Solar, error) {
	ev, ok := solarEventTable[event]
	if !ok {
		names := append([]string(nil), SolarEvents...)
		sort.Strings(names)
		return nil, fmt.Errorf("solar: unknown event %q (one of %s)", event, strings.Join(names, ", "))
	}
	if math.IsNaN(lat) || lat < -90 || lat > 90 {
		return nil, fmt.Errorf("solar: latitude %v is not between -90 and 90", lat)
	}
	if math.Abs(lat) > 89.9 {
		// Hour angles degenerate at a pole: ephem (and so Celery) finds
		// no event there either.
		return nil, fmt.Errorf("solar: latitude %v is within 0.1 degrees of a pole, where rising and setting are undefined", lat)
	}
	if math.IsNaN(lon) || lon < -180 || lon > 180 {
		return nil, fmt.Errorf("solar: longitude %v is not between -180 and 180", lon)
	}
	return &Solar{Event: event, Lat: lat, Lon: lon, ev: ev}, nil
}

func (s *Solar) String() string {
	return fmt.Sprintf("solar %s at %g, %g", s.Event, s.Lat, s.Lon)
}

// solarSearchDays bounds the search for a day on which the event occurs.
// At the poles the Sun stays up or down for about half a year.
const solarSearchDays = 400

// Next returns the first event strictly after t, rounded to the second so
// that every replica (and every architecture's floating point) names the
// same slot; the zero time if the event does not occur within
// solarSearchDays (the pole in a year without the event).
func (s *Solar) Next(t time.Time) time.Time {
	// Start a second early: an event just before t whose slot rounds up
	// past t is still the next slot.
	from := julianDay(t) - 1.0/86400
	limit := from + solarSearchDays
	for from < limit {
		jd, ok, resume := s.find(from)
		if !ok {
			// Always move on, even if the search ended behind where it
			// began (it can, right at a pole).
			from = max(resume, from+1.0/24)
			continue
		}
		slot := fromJulianDay(jd)
		if slot.After(t) {
			return slot
		}
		// The rounded slot is t or before it: that event has passed.
		from = jd + 1.0/1440
	}
	return time.Time{}
}

// find returns the next event after the instant jd. When the Sun does not
// cross the horizon in the day the search looked at, ok is false and
// resume is where to look next.
func (s *Solar) find(jd float64) (event float64, ok bool, resume float64) {
	var x float64
	var circumpolar bool
	if s.ev.kind == transitEvent {
		x = s.transit(jd)
	} else {
		var converged bool
		x, circumpolar, converged = s.riseSet(jd)
		if circumpolar {
			return 0, false, x + 1.0/1440
		}
		if !converged || x <= jd {
			return 0, false, jd + 0.5 // look again half a day on
		}
	}
	// The iteration's last digits depend on where it started. Refine from
	// a canonical point near the answer, so that Next from any instant
	// before an event names the same slot.
	c := math.Round(x*144) / 144 // the nearest 10 minutes
	if s.ev.kind == transitEvent {
		x = s.refineTransit(c)
	} else {
		x = s.refineRiseSet(c, x)
	}
	return x, true, 0
}

// newtonPrecision is ephem's: a tenth of a second, in days.
const newtonPrecision = 0.1 / 86400

// riseSet follows ephem's search (Observer._find_rise_or_set): step the
// date by the hour angle still to go until the step is below
// newtonPrecision. The first step always goes forward. When the target
// altitude is out of reach the target hour angle is the antitransit (the
// Sun stays up) or the transit (it stays down), and circumpolar is set.
func (s *Solar) riseSet(jd float64) (x float64, circumpolar, converged bool) {
	first := true
	var absTarget float64
	for i := 0; i < 100; i++ {
		ha, dec, h0 := s.position(jd)
		var reach bool
		absTarget, reach = targetHourAngle(s.Lat*deg, dec, h0)
		target := absTarget
		if s.ev.kind == riseEvent {
			target = -absTarget
		}
		diff := target - ha
		var bump float64
		if first {
			diff = math.Mod(diff, 2*math.Pi)
			if diff < 0 {
				diff += 2 * math.Pi
			}
			bump = diff / (2 * math.Pi)
			if math.Abs(bump) < newtonPrecision {
				bump++
			}
			first = false
		} else {
			bump = plusMinusPi(diff) / (2 * math.Pi)
		}
		if math.Abs(bump) < newtonPrecision {
			return jd, !reach, true
		}
		jd += bump
	}
	return jd, false, false
}

// refineRiseSet runs the same iteration without the forward first step,
// from c, and falls back to x if that leaves the event (it cannot, within
// 5 minutes of a crossing; the guard only keeps a bad step harmless).
func (s *Solar) refineRiseSet(c, x float64) float64 {
	jd := c
	for i := 0; i < 100; i++ {
		ha, dec, h0 := s.position(jd)
		absTarget, _ := targetHourAngle(s.Lat*deg, dec, h0)
		target := absTarget
		if s.ev.kind == riseEvent {
			target = -absTarget
		}
		bump := plusMinusPi(target-ha) / (2 * math.Pi)
		jd += bump
		if math.Abs(bump) < newtonPrecision/100 {
			break
		}
	}
	if math.Abs(jd-x) > 1.0/1440 {
		return x
	}
	return jd
}

// targetHourAngle is the hour angle at which a body at declination dec is
// at altitude h0; out of reach, ephem's sentinels: just past π (always
// above) or just below 0 (always below).
func targetHourAngle(lat, dec, h0 float64) (float64, bool) {
	arg := (math.Sin(h0) - math.Sin(lat)*math.Sin(dec)) / (math.Cos(lat) * math.Cos(dec))
	switch {
	case arg < -1:
		return math.Pi + 1e-15, false
	case arg > 1:
		return -1e-15, false
	}
	return math.Acos(arg), true
}

// transit is the next passage of the Sun across the meridian after jd,
// as ephem's next_transit: forward by the hour angle to go, then solve.
func (s *Solar) transit(jd float64) float64 {
	ha, _, _ := s.position(jd)
	toMove := math.Mod(-ha, 2*math.Pi)
	if toMove < 0 {
		toMove += 2 * math.Pi
	}
	if toMove < 1e-12 {
		toMove = 2 * math.Pi
	}
	return s.refineTransit(jd + toMove/(2*math.Pi))
}

// refineTransit solves "hour angle = 0" by Newton steps from c.
func (s *Solar) refineTransit(c float64) float64 {
	jd := c
	for i := 0; i < 20; i++ {
		ha, _, _ := s.position(jd)
		bump := -plusMinusPi(ha) / (2 * math.Pi)
		jd += bump
		if math.Abs(bump) < newtonPrecision/100 {
			break
		}
	}
	return jd
}

// position is the Sun's geocentric apparent hour angle and declination at
// jd (UT), and the geocentric altitude that puts the event's point of the
// disc on the horizon as seen from the surface (the horizon lowered by the
// Sun's radius for the upper limb, raised by its parallax).
func (s *Solar) position(jd float64) (ha, dec, h0 float64) {
	ra, dec, dist := sunApparent(jd)
	ha = apparentSidereal(jd) + s.Lon*deg - ra
	h0 = s.ev.horizonDeg * deg
	if !s.ev.center {
		h0 -= 959.63 / 3600 * deg / dist // the solar semi-diameter
	}
	parallax := 8.794 / 3600 * deg / dist
	h0 += parallax * math.Cos(h0)
	return ha, dec, h0
}

const deg = math.Pi / 180

func plusMinusPi(a float64) float64 {
	a = math.Mod(a+math.Pi, 2*math.Pi)
	if a < 0 {
		a += 2 * math.Pi
	}
	return a - math.Pi
}

// julianDay is t's Julian day number in UT (from the Unix time).
func julianDay(t time.Time) float64 {
	return 2440587.5 + float64(t.Unix())/86400 + float64(t.Nanosecond())/86400e9
}

// fromJulianDay is the instant of a Julian day, rounded to the second.
func fromJulianDay(jd float64) time.Time {
	secs := math.Round((jd - 2440587.5) * 86400)
	return time.Unix(int64(secs), 0).UTC()
}

// deltaT is TT − UT in seconds (Espenak and Meeus's polynomial for
// 2005–2050, extended outside it; a second's error moves the Sun by 0.04″).
func deltaT(jd float64) float64 {
	y := 2000 + (jd-2451544.5)/365.25 - 2000
	return 62.92 + 0.32217*y + 0.005589*y*y
}

// sunApparent is the Sun's geocentric apparent right ascension and
// declination (radians) and its distance (AU) at jd (UT), after Meeus,
// Astronomical Algorithms, ch. 22 and 25, with the main nutation terms.
func sunApparent(jd float64) (ra, dec, dist float64) {
	return sunPosition(jd, true)
}

// sunApparentUncorrected is sunApparent without the fitted correction, for
// refitting it.
func sunApparentUncorrected(jd float64) (ra, dec, dist float64) {
	return sunPosition(jd, false)
}

func sunPosition(jd float64, corrected bool) (ra, dec, dist float64) {
	jde := jd + deltaT(jd)/86400
	T := (jde - 2451545) / 36525
	L0 := 280.46646 + 36000.76983*T + 0.0003032*T*T
	M := (357.52911 + 35999.05029*T - 0.0001537*T*T) * deg
	e := 0.016708634 - 0.000042037*T - 0.0000001267*T*T
	C := (1.914602-0.004817*T-0.000014*T*T)*math.Sin(M) +
		(0.019993-0.000101*T)*math.Sin(2*M) + 0.000289*math.Sin(3*M)
	trueLong := L0 + C
	nu := M + C*deg
	dist = 1.000001018 * (1 - e*e) / (1 + e*math.Cos(nu))

	if corrected {
		trueLong += sunLonCorrection(T) / 3600
	}
	dpsi, deps := nutation(T)
	lambda := (trueLong - 20.4898/3600/dist + dpsi/3600) * deg
	eps := (meanObliquity(T) + deps/3600) * deg
	ra = math.Atan2(math.Cos(eps)*math.Sin(lambda), math.Cos(lambda))
	dec = math.Asin(math.Sin(eps) * math.Sin(lambda))
	return ra, dec, dist
}

// meanObliquity of the ecliptic in degrees (Meeus 22.2).
func meanObliquity(T float64) float64 {
	return 23.0 + 26.0/60 + (21.448-46.8150*T-0.00059*T*T+0.001813*T*T*T)/3600
}

// nutation in longitude and obliquity, in arcseconds (Meeus ch. 22, the
// terms above 0.05″).
func nutation(T float64) (dpsi, deps float64) {
	omega := (125.04452 - 1934.136261*T) * deg
	L := (280.4665 + 36000.7698*T) * deg   // the Sun's mean longitude
	Lm := (218.3165 + 481267.8813*T) * deg // the Moon's
	dpsi = -17.20*math.Sin(omega) - 1.32*math.Sin(2*L) - 0.23*math.Sin(2*Lm) + 0.21*math.Sin(2*omega)
	deps = 9.20*math.Cos(omega) + 0.57*math.Cos(2*L) + 0.10*math.Cos(2*Lm) - 0.09*math.Cos(2*omega)
	return dpsi, deps
}

// apparentSidereal is Greenwich apparent sidereal time in radians at jd
// (UT): the mean (Meeus 12.4) plus the equation of the equinoxes.
func apparentSidereal(jd float64) float64 {
	T := (jd - 2451545) / 36525
	theta := 280.46061837 + 360.98564736629*(jd-2451545) + 0.000387933*T*T - T*T*T/38710000
	dpsi, deps := nutation(T)
	eps := (meanObliquity(T) + deps/3600) * deg
	theta += dpsi / 3600 * math.Cos(eps)
	return math.Mod(theta, 360) * deg
}

// PolarGaps reports the spans of the coming days after from in which the
// event does not occur (polar day or night): each is the last event before
// the span (or from) and the first after it, at which beatd fires. Two
// events more than 36 hours apart make a span.
func (s *Solar) PolarGaps(from time.Time, days int) [][2]time.Time {
	var gaps [][2]time.Time
	end := from.AddDate(0, 0, days)
	prev := from
	for prev.Before(end) {
		next := s.Next(prev)
		if next.IsZero() {
			return append(gaps, [2]time.Time{prev, time.Time{}})
		}
		if next.Sub(prev) > 36*time.Hour {
			gaps = append(gaps, [2]time.Time{prev, next})
		}
		prev = next
	}
	return gaps
}
