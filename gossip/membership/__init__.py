"""Membership: a peer's place in a group whose members change (joins, restarts, leaves, and
with ``elastic=True`` deaths), its re-forming at step boundaries, and the state a member
takes from another.

- controller.py: PeerMembership, the peer's membership controller (its door, the view-change
  protocol of collectives/group/, what a committed switch does to the peer and its policies,
  a joiner's take of the state, a planned leave); member_identity.
- state_transfer.py: a member's state (parameters, optimizer, policy) sent to those that
  take it, in chunks from several donors, checked by digest.
- contracts.py: MembershipParticipant (what the controller needs from a policy) and
  MembershipHost (what it needs from the peer that owns it).

The step boundary, one way through three objects:

    Policy.after_step()
      -> peer.at_boundary(policy, step)          PolicyHost (policies/base/policy_host.py)
        -> controller.at_boundary(policy, step)  the Peer delegates to the controller it owns
          -> policy.view_changing(switch), ...   MembershipParticipant: the policies' hooks
          -> peer.install_transport(transport)   MembershipHost: the Peer's public methods

The policy calls only the peer, the peer only its controller, and the controller calls the
policies only through their public hooks and the peer only through its public methods; no
object writes another's private attributes. A recovery after a death goes the same way
(Policy._recover -> peer.recover -> controller.recover), and so does a joiner's first attach
(Policy.attach -> peer.attached -> controller.attached: the state fetched since the
admission is loaded there).
"""
from gossip.membership.contracts import MembershipHost, MembershipParticipant
from gossip.membership.controller import MEMBER_FIELDS, PeerMembership, member_identity
from gossip.membership.state_transfer import (CHUNK_BYTES, Prefetch, load_state, params_of,
                                              receive_state, send_state, state_of)

__all__ = ["PeerMembership", "MembershipParticipant", "MembershipHost", "member_identity",
           "MEMBER_FIELDS", "send_state", "receive_state", "Prefetch", "state_of",
           "params_of", "load_state", "CHUNK_BYTES"]
