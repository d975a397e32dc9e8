package agentapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// Client talks to the agent on one socket.
type Client struct {
	socket string
	hc     *http.Client

	mu    sync.Mutex
	first net.Conn // the connection Dial made, for the first request
}

// Dial connects to the agent's socket. An error (wrapping ErrUnavailable)
// means nothing listens there; the connection made serves the first
// request, so probing costs no extra connect.
func Dial(ctx context.Context, socket string) (*Client, error) {
	c := &Client{socket: socket}
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	c.first = conn
	c.hc = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c.mu.Lock()
			conn := c.first
			c.first = nil
			c.mu.Unlock()
			if conn != nil {
				return conn, nil
			}
			return c.dial(ctx)
		},
		DisableCompression:  true,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}}
	return c, nil
}

func (c *Client) dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		return nil, &dialError{socket: c.socket, err: err}
	}
	return conn, nil
}

// dialError marks a request that was never sent.
type dialError struct {
	socket string
	err    error
}

func (e *dialError) Error() string {
	return fmt.Sprintf("%v at %s: %v", ErrUnavailable, e.socket, e.err)
}

func (e *dialError) Unwrap() []error { return []error{ErrUnavailable, e.err} }

// Socket is the socket the client talks to.
func (c *Client) Socket() string { return c.socket }

// Close drops the client's connections.
func (c *Client) Close() {
	c.mu.Lock()
	if c.first != nil {
		_ = c.first.Close()
		c.first = nil
	}
	c.mu.Unlock()
	c.hc.CloseIdleConnections()
}

// Call posts req to an endpoint and decodes the answer into resp. Errors
// are an *Error from the agent, or wrap ErrUnavailable (not sent) or
// ErrConnectionLost (sent, no answer), or the context's error.
func (c *Client) Call(ctx context.Context, endpoint string, req, resp any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://tabbyd"+Path+endpoint, bytes.NewReader(body))
	if err != nil {
		return err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hresp, err := c.hc.Do(hreq)
	if err != nil {
		var de *dialError
		switch {
		case errors.As(err, &de):
			return de
		case ctx.Err() != nil:
			return fmt.Errorf("asking tabbyd's CNI agent at %s (%s): %w", c.socket, endpoint, ctx.Err())
		default:
			return fmt.Errorf("%w (%s at %s): %v", ErrConnectionLost, endpoint, c.socket, err)
		}
	}
	defer hresp.Body.Close()
	data, err := io.ReadAll(hresp.Body)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("reading the answer of tabbyd's CNI agent at %s (%s): %w", c.socket, endpoint, ctx.Err())
		}
		return fmt.Errorf("%w (%s at %s): %v", ErrConnectionLost, endpoint, c.socket, err)
	}
	if hresp.StatusCode != http.StatusOK {
		e := &Error{}
		jerr := json.Unmarshal(data, e)
		if hresp.StatusCode == http.StatusNotFound && (jerr != nil || e.Message == "") {
			return fmt.Errorf("%w: tabbyd's CNI agent at %s does not serve %s (an older tabbyd)", ErrUnknownEndpoint, c.socket, endpoint)
		}
		if jerr != nil || e.Message == "" {
			e.Message = fmt.Sprintf("tabbyd's CNI agent at %s answered %s to %s: %q", c.socket, hresp.Status, endpoint, bytes.TrimSpace(data))
		}
		return e
	}
	if resp == nil {
		return nil
	}
	if err := json.Unmarshal(data, resp); err != nil {
		return fmt.Errorf("decoding the answer of tabbyd's CNI agent at %s (%s): %w", c.socket, endpoint, err)
	}
	return nil
}

// Assign calls assign.
func (c *Client) Assign(ctx context.Context, req AssignRequest) ([]Address, error) {
	var resp AssignResponse
	err := c.Call(ctx, EndpointAssign, req, &resp)
	return resp.Addresses, err
}

// ReleaseHandle calls release-handle.
func (c *Client) ReleaseHandle(ctx context.Context, handleID, node string) error {
	return c.Call(ctx, EndpointRelease, HandleRequest{HandleID: handleID, Node: node}, nil)
}

// HandleIPs calls handle-ips.
func (c *Client) HandleIPs(ctx context.Context, handleID, node string) ([]net.IP, error) {
	var resp HandleIPsResponse
	err := c.Call(ctx, EndpointHandleIPs, HandleRequest{HandleID: handleID, Node: node}, &resp)
	return resp.IPs, err
}

// NodeHandles calls node-handles.
func (c *Client) NodeHandles(ctx context.Context, node string) ([]string, error) {
	var resp NodeHandlesResponse
	err := c.Call(ctx, EndpointNodeHandles, NodeRequest{Node: node}, &resp)
	return resp.Handles, err
}

// UsablePools calls usable-pools.
func (c *Client) UsablePools(ctx context.Context, node string) ([]Pool, error) {
	var resp PoolsResponse
	err := c.Call(ctx, EndpointPools, NodeRequest{Node: node}, &resp)
	return resp.Pools, err
}

// PolicyWait calls policy-wait: it returns once tabbyd has programmed the
// pod's NetworkPolicy, or at once when tabbyd does not enforce any.
func (c *Client) PolicyWait(ctx context.Context, req PolicyWaitRequest) (PolicyWaitResponse, error) {
	var resp PolicyWaitResponse
	err := c.Call(ctx, EndpointPolicyWait, req, &resp)
	return resp, err
}

// Ping calls ping: the agent answers when it can reach the API server.
func (c *Client) Ping(ctx context.Context) error {
	return c.Call(ctx, EndpointPing, Empty{}, nil)
}

// Report calls report. The plugin ignores its error: a command's result
// never depends on tabbyd counting it.
func (c *Client) Report(ctx context.Context, r CommandReport) error {
	return c.Call(ctx, EndpointReport, r, nil)
}
