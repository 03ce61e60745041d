// Package sqs is the Amazon SQS transport: it sends fires as Kombu's SQS
// transport does (base64 of the Kombu envelope, Kombu's queue names,
// MessageGroupId and MessageDeduplicationId on .fifo queues), in batches
// of ten, and makes up for SQS having no fence it could check by writing
// what it is about to send to etcd under the leader's fence first, so a
// new leader resolves whatever an older term left unconfirmed (sqs.go
// says how, and what remains).
package sqs
