package sqs

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// URL is an sqs:// broker URL in Kombu's form, with the transport options
// beatd reads from its query.
type URL struct {
	// Endpoint overrides the SQS endpoint: from the URL's host and port
	// as Kombu takes it (http://, or https:// with is_secure=true), or
	// from endpoint_url=. "" is AWS's endpoint for the region.
	Endpoint string
	// Region is the AWS region; "" leaves it to the AWS chain
	// (AWS_REGION, the shared config file), and then Kombu's us-east-1.
	Region string
	// QueueNamePrefix is prepended to every queue name, as Kombu's
	// queue_name_prefix transport option.
	QueueNamePrefix string
	// PredefinedQueues maps a queue's SQS name to its URL, as Kombu's
	// predefined_queues: when set, only these queues are used and none is
	// created.
	PredefinedQueues map[string]string
	// Base64 is Kombu's sqs_base64_encoding (default true): the message
	// body is the base64 of the envelope, else the envelope itself.
	Base64 bool
}

// IsSQSURL reports whether raw is an SQS broker URL.
func IsSQSURL(raw string) bool {
	return strings.HasPrefix(strings.ToLower(strings.TrimSpace(raw)), "sqs://")
}

// consumerOptions are Kombu SQS transport options that only a consumer
// reads: accepted, so a worker's URL can be shared, and ignored.
var consumerOptions = map[string]bool{"visibility_timeout": true, "wait_time_seconds": true, "polling_interval": true}

var regionRE = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]+$`)

// ParseURL parses an sqs:// URL. Credentials in it are refused: beatd
// takes them only from the AWS chain.
func ParseURL(raw string) (URL, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return URL{}, fmt.Errorf("sqs: broker URL: %w", err)
	}
	if !strings.EqualFold(u.Scheme, "sqs") {
		return URL{}, fmt.Errorf("sqs: broker URL %q: scheme %q, want sqs://", redacted(u), u.Scheme)
	}
	if u.User != nil {
		return URL{}, errors.New("sqs: the broker URL carries credentials (sqs://KEY:SECRET@...): beatd never takes a secret from a flag value; " +
			"remove them and give them as the AWS SDKs read them: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, " +
			"the shared credentials and config files (AWS_PROFILE), or web identity (AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN, as IRSA sets them)")
	}
	if u.Path != "" && u.Path != "/" {
		return URL{}, fmt.Errorf("sqs: broker URL %q: unexpected path %q (queues are named by the entries, mapped with queue_name_prefix or predefined_queues)", redacted(u), u.Path)
	}
	out := URL{Base64: true}
	secure := false
	q := u.Query()
	names := make([]string, 0, len(q))
	for k := range q {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		vs := q[k]
		v := vs[len(vs)-1]
		switch k {
		case "region":
			if !regionRE.MatchString(v) {
				return URL{}, fmt.Errorf("sqs: broker URL: region=%q is not an AWS region name (like eu-west-1)", v)
			}
			out.Region = v
		case "queue_name_prefix":
			out.QueueNamePrefix = v
		case "is_secure":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return URL{}, fmt.Errorf("sqs: broker URL: is_secure=%q: want true or false", v)
			}
			secure = b
		case "sqs_base64_encoding":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return URL{}, fmt.Errorf("sqs: broker URL: sqs_base64_encoding=%q: want true or false", v)
			}
			out.Base64 = b
		case "endpoint_url":
			e, err := url.Parse(v)
			if err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
				return URL{}, fmt.Errorf("sqs: broker URL: endpoint_url=%q: want http(s)://HOST[:PORT]", v)
			}
			if e.User != nil {
				return URL{}, errors.New("sqs: broker URL: endpoint_url carries credentials: give them through the AWS chain")
			}
			out.Endpoint = strings.TrimSuffix(v, "/")
		case "predefined_queues":
			out.PredefinedQueues = map[string]string{}
			for _, v := range vs {
				for _, pair := range strings.Split(v, ",") {
					name, qurl, ok := strings.Cut(strings.TrimSpace(pair), "=")
					if pair == "" {
						continue
					}
					pu, err := url.Parse(qurl)
					if !ok || name == "" || err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
						return URL{}, fmt.Errorf("sqs: broker URL: predefined_queues: %q is not NAME=QUEUE_URL", pair)
					}
					out.PredefinedQueues[name] = qurl
				}
			}
		default:
			if consumerOptions[k] {
				continue
			}
			return URL{}, fmt.Errorf("sqs: broker URL: unknown option %q (beatd reads region, queue_name_prefix, predefined_queues, endpoint_url, is_secure, sqs_base64_encoding)", k)
		}
	}
	if u.Host != "" {
		if out.Endpoint != "" {
			return URL{}, fmt.Errorf("sqs: broker URL %q names an endpoint twice: as its host and as endpoint_url", redacted(u))
		}
		// Kombu's endpoint_url: http unless is_secure is true.
		scheme := "http"
		if secure {
			scheme = "https"
		}
		out.Endpoint = scheme + "://" + u.Host
	}
	return out, nil
}

func redacted(u *url.URL) string { return u.Redacted() }
