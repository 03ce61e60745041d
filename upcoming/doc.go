// Package upcoming answers when an entry fires, as the leader decides:
// its schedule anchored where it began, bounded by end_at and its
// calendars, and no more slots than its max_runs leaves. The leader's
// loop, the status view, the console and `beatd next` all ask it, so
// they agree.
package upcoming
