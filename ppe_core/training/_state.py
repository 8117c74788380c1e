"""The key under which ppe-core keeps its own data in a state dictionary (the rest of the
layout, PPE's, is ``ExtensionsManager.state_dict``'s)."""

#: The key under which ppe-core keeps its own resume data in a state dictionary. PPE's
#: ``load_state_dict`` ignores unknown top-level keys, so such states still load into PPE.
PPE_CORE_STATE_KEY = "_ppe_core"
