"""How to get from observed state to desired state.

One reconciler per resource kind (observe -> plan -> apply), reaching the
world only through Protocol ports defined here. May import `specs`, never
`blazar`. The reconcilers themselves arrive with the manifest work; this
package exists now so the layering contract holds from the first commit.
"""
