#!/usr/bin/python3
"""Generate solar test vectors from real Celery (Debian python3-celery 5.2.6)
and ephem (python3-ephem 4.1.4).

Each output line is one case: an event, a place, a start instant ("from", as
beat's last_run_at) and the next event time as Celery's solar schedule
computes it: solar.remaining_estimate(from) with now = from, so next =
from + remaining. That is Celery's own code path (its ephem Observer, its
horizons, its centre/edge choice, no refraction).

Two documented deviations are applied, and marked in "deviation":

* "dusk_astronomical_horizon": Celery 5.2.6 gives dusk_astronomical the
  horizon '18' instead of '-18'. beatd uses -18 degrees, so the generator
  sets the observer's horizon to '-18' for that event before asking Celery.
* "polar": where the Sun does not cross the horizon that day, ephem raises a
  CircumpolarError and Celery 5.2.6's fallback raises a TypeError (it adds a
  timedelta to an ephem.Date), killing celery beat. beatd fires at the next
  day on which the event occurs; the generator finds it by asking Celery
  again from just after the (anti)transit ephem stopped at, until it answers.

Ten places over 2026, including both polar circles, the high Arctic and
Antarctic, the equator and both sides of the date line; every event; a
start every two days at a pseudo-random time of day.

Run from this directory:

    /usr/bin/python3 gen_solar_vectors.py > solar_vectors.jsonl

The seed is fixed, so the file reproduces byte for byte.
"""
import json
import random
from datetime import datetime, timedelta, timezone

import ephem
from celery import Celery
from celery.schedules import solar

PLACES = [
    ("berlin", 52.52, 13.40),
    ("tromso", 69.65, 18.96),          # north of the Arctic Circle
    ("rovaniemi", 66.56, 25.73),       # on the Arctic Circle
    ("longyearbyen", 78.22, 15.65),    # high Arctic
    ("mawson", -67.60, 62.87),         # south of the Antarctic Circle
    ("mcmurdo", -77.85, 166.67),       # high Antarctic, near the date line
    ("quito", -0.18, -78.47),          # equator
    ("suva", -18.14, 178.44),          # west of the date line
    ("apia", -13.83, -171.76),         # east of the date line
    ("anchorage", 61.22, -149.90),
]

EVENTS = [
    "dawn_astronomical", "dawn_nautical", "dawn_civil", "sunrise", "solar_noon",
    "sunset", "dusk_civil", "dusk_nautical", "dusk_astronomical",
]

app = Celery("vectors")
app.conf.timezone = "UTC"
app.conf.enable_utc = True


def celery_next(event, lat, lon, start):
    """Celery's next event after start, with the two deviations."""
    deviation = None
    t = start
    for _ in range(400):
        s = solar(event, lat, lon, app=app, nowfun=lambda t=t: t)
        if event == "dusk_astronomical":
            s.cal.horizon = "-18"
            deviation = "dusk_astronomical_horizon"
        try:
            nxt = t + s.remaining_estimate(t)
            return nxt, deviation
        except TypeError:
            # Celery's CircumpolarError fallback crashed. Ask ephem which
            # kind, then look again after the (anti)transit it stopped at.
            deviation = "polar"
            obs = s.cal
            obs.date = t
            try:
                getattr(obs, s.method)(ephem.Sun(), start=t, use_center=s.use_center)
            except ephem.AlwaysUpError:
                stop = obs.next_antitransit(ephem.Sun(), start=t)
            except ephem.NeverUpError:
                stop = obs.next_transit(ephem.Sun(), start=t)
            t = stop.datetime().replace(tzinfo=timezone.utc) + timedelta(minutes=1)
    raise RuntimeError(f"no {event} at {lat},{lon} within 400 days of {start}")


def main():
    rnd = random.Random(11)
    base = datetime(2026, 1, 1, tzinfo=timezone.utc)
    for name, lat, lon in PLACES:
        for day in range(0, 365, 2):
            for event in EVENTS:
                start = base + timedelta(days=day, seconds=rnd.randrange(86400),
                                         microseconds=rnd.randrange(1000000))
                nxt, deviation = celery_next(event, lat, lon, start)
                rec = {"place": name, "lat": lat, "lon": lon, "event": event,
                       "from": start.isoformat(), "celery": nxt.isoformat()}
                if deviation:
                    rec["deviation"] = deviation
                print(json.dumps(rec, sort_keys=True))


if __name__ == "__main__":
    main()
