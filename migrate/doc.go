// Package migrate converts a Celery beat schedule (a Celery app's
// beat_schedule dumped by contrib/celery_dump.py, a django-celery-beat
// database dumped by manage.py dumpdata, or RedBeat's Redis hashes) into a
// schedules.yaml that beatd accepts, noting every approximation and naming
// every entry it cannot express, and extracts what each entry last sent.
package migrate
