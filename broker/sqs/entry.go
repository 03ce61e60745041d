package sqs

import (
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// sqsEntry is m as entry i of a SendMessageBatch: the body, and on a
// .fifo queue its group and deduplication ids. Kombu's SQS transport sets
// no message attributes.
func sqsEntry(i int, m *message) types.SendMessageBatchRequestEntry {
	e := types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(m.Body)}
	if m.Group != "" {
		e.MessageGroupId = aws.String(m.Group)
	}
	if m.Dedup != "" {
		e.MessageDeduplicationId = aws.String(m.Dedup)
	}
	return e
}
