// Package console serves beatd's web console: a server-rendered page, on
// every replica, of what is scheduled, what fired, who leads and how the
// replicas are, with trigger, pause and resume for holders of the admin
// token, kept live with Server-Sent Events. Every asset is embedded.
package console
