// Package publisher turns a fire into the exact Celery task message a Python
// producer would write, and pushes it to Redis with one fenced, deduplicated,
// atomic script.
package publisher
